"""Crash safety with real worker processes (`python -m services.worker`, simulated engine, a measuring
instrument): a SIGKILLed worker's requests are re-run by the next worker and answered exactly once."""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import pytest
from redis.asyncio import Redis
from worker_procs import stage_request, wait_until, worker_env

from services.common.keys import Keys
from services.common.queue import QueueStore
from services.common.redis_proc import PrivateRedis
from services.common.types import Prediction, StageRequest

pytestmark = pytest.mark.redis

ENGINE = "ek"


def _env(redis: PrivateRedis, keys: Keys, **extra: str) -> dict[str, str]:
    knobs = {
        "CHIMERA_WORKER_LEASE_S": "1.0",
        # Every output is 40 tokens; at batch 2 a step is ~34 ms / 4, so a request runs ~0.35 s.
        "CHIMERA_WORKER_SIM_LENGTH_MEDIAN": "40",
    }
    return worker_env(redis, keys, ENGINE, **{**knobs, **extra})


def _req(rid: str) -> StageRequest:
    return stage_request(rid, max_tokens=1000, program_id=f"prog-{rid}")


async def _events(r: Redis, keys: Keys, rid: str) -> list[dict[str, Any]]:
    return [json.loads(f["ev"]) for _id, f in await r.xrange(keys.output(ENGINE, rid))]


async def _wait(cond: Any, timeout: float) -> None:
    await wait_until(cond, timeout, every_s=0.02)


async def _finals(r: Redis, keys: Keys, rids: list[str]) -> dict[str, list[dict[str, Any]]]:
    return {rid: [e for e in await _events(r, keys, rid) if e["t"] in ("final", "error")] for rid in rids}


async def test_sigkilled_worker_requests_are_answered_exactly_once(
    private_redis: PrivateRedis, redis_client: Redis, keys: Keys, spawn: Any
) -> None:
    q = QueueStore(redis_client, keys)
    rids = [f"k{i}" for i in range(8)]
    for i, rid in enumerate(rids):
        assert await q.enqueue(ENGINE, _req(rid), Prediction(40, 80), float(i), time.time(), {})
    first = spawn(_env(private_redis, keys), "first")

    async def mid_request() -> bool:
        return any(e["t"] == "delta" for e in await _events(redis_client, keys, "k0"))

    await _wait(mid_request, 20)
    assert not (await _finals(redis_client, keys, ["k0"]))["k0"]
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    assert await redis_client.zcard(keys.claims(ENGINE)) > 0  # the dead worker's leases are still held

    second = spawn(_env(private_redis, keys), "second")

    async def all_answered() -> bool:
        return all((await _finals(redis_client, keys, rids)).values())

    await _wait(all_answered, 30)
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=15) == 0

    finals = await _finals(redis_client, keys, rids)
    for rid in rids:
        assert len(finals[rid]) == 1, (rid, finals[rid])
        final = finals[rid][0]
        assert final["t"] == "final" and final["finish_reason"] == "stop" and final["completion_tokens"] == 40
        deltas = [
            e for e in await _events(redis_client, keys, rid) if e["t"] == "delta" and e["a"] == final["a"]
        ]
        assert final["text"] == "".join(e["text"] for e in deltas)
    assert finals["k0"][0]["attempt"] == 2  # k0 was running when the first worker died
    assert int(await redis_client.hget(keys.engine_info(ENGINE), "load") or 0) == 0
    assert await redis_client.zcard(keys.claims(ENGINE)) == 0
    assert await redis_client.zcard(keys.queue(ENGINE)) == 0


async def test_sigterm_lets_running_requests_finish(
    private_redis: PrivateRedis, redis_client: Redis, keys: Keys, spawn: Any
) -> None:
    q = QueueStore(redis_client, keys)
    for i, rid in enumerate(["t0", "t1"]):
        assert await q.enqueue(ENGINE, _req(rid), Prediction(40, 80), float(i), time.time(), {})
    proc = spawn(_env(private_redis, keys, CHIMERA_WORKER_GRACE_S="20"), "graceful")

    async def streaming() -> bool:
        return any(e["t"] == "delta" for e in await _events(redis_client, keys, "t1"))

    await _wait(streaming, 20)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    finals = await _finals(redis_client, keys, ["t0", "t1"])
    assert all(len(f) == 1 and f[0]["finish_reason"] == "stop" for f in finals.values())
    assert int(await redis_client.hget(keys.engine_info(ENGINE), "load") or 0) == 0
