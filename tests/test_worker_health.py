"""Engine health and re-registration with real processes (`python -m services.worker` on the simulated
engine, a measuring instrument, and `python -m services.jobs.healthcheck`) against a private redis-server.

The engine is killed by the simulated engine's FAULT INJECTION knob (CHIMERA_WORKER_SIM_FAULT_DIE_AFTER_S):
the worker must turn unhealthy at once, hand its claims back to the queue and exit non-zero, whether the
engine died under running requests or while idle."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from typing import Any

import pytest
from redis.asyncio import Redis
from worker_procs import ROOT, stage_request, wait_until, worker_env

from services.common.keys import Keys
from services.common.queue import QueueStore
from services.common.redis_proc import PrivateRedis
from services.common.types import Prediction, StageRequest

pytestmark = pytest.mark.redis

ENGINE = "eh"


def _env(redis: PrivateRedis, keys: Keys, **extra: str) -> dict[str, str]:
    knobs = {
        "CHIMERA_WORKER_LEASE_S": "30",  # long: anything back in the queue was handed back, not reaped
        "CHIMERA_WORKER_HEARTBEAT_S": "0.2",
        "CHIMERA_WORKER_METRICS_PORT": "0",
        # Long outputs: a request is still running when the fault injection kills the engine.
        "CHIMERA_WORKER_SIM_LENGTH_MEDIAN": "100000",
    }
    return worker_env(redis, keys, ENGINE, **{**knobs, **extra})


def _req(rid: str) -> StageRequest:
    return stage_request(rid, max_tokens=100_000, program_id=f"prog-{rid}")


_wait = wait_until


def _healthcheck(redis: PrivateRedis, keys: Keys) -> subprocess.CompletedProcess[str]:
    env = _env(redis, keys)
    return subprocess.run(
        [sys.executable, "-m", "services.jobs.healthcheck", "heartbeat", ENGINE, "--max-age-s", "5"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def _exit_code(proc: subprocess.Popen[bytes], timeout: float) -> int:
    return await asyncio.to_thread(proc.wait, timeout)


async def _registered(r: Redis, keys: Keys) -> bool:
    return bool(await r.sismember(keys.engines(), ENGINE)) and bool(
        await r.hget(keys.engine_info(ENGINE), "model")
    )


async def test_engine_death_under_requests_hands_claims_back_and_exits(
    private_redis: PrivateRedis, keys: Keys, spawn: Any
) -> None:
    r = Redis.from_url(private_redis.url, decode_responses=True)
    try:
        q = QueueStore(r, keys)
        rids = ["a", "b", "c", "d"]
        for i, rid in enumerate(rids):
            assert await q.enqueue(ENGINE, _req(rid), Prediction(10, 20), float(i), time.time(), {})
        proc = spawn(_env(private_redis, keys, CHIMERA_WORKER_SIM_FAULT_DIE_AFTER_S="2.5"), "dying")
        # Two run in the engine, one is prefetched (it waits inside the engine), one waits in the queue.
        await _wait(lambda: r.zcard(keys.claims(ENGINE)), 30)
        assert _healthcheck(private_redis, keys).returncode == 0
        assert await _exit_code(proc, 60) != 0  # non-zero: the supervisor restarts it

        assert await r.zcard(keys.claims(ENGINE)) == 0  # handed back, not left to a 30 s lease
        assert await r.zrange(keys.queue(ENGINE), 0, -1) == rids  # each in its original place
        deaths = {rid: (await q.request_fields(ENGINE, rid)).get("deaths") for rid in rids}
        # a and b ran, c (the prefetch) waited inside the engine: all three were the engine's when it died
        # and are charged; d was never claimed.
        assert deaths == {"a": "1", "b": "1", "c": "1", "d": None}
        info = await r.hgetall(keys.engine_info(ENGINE))
        assert (info["health"], info["heartbeat_ms"]) == ("dead", "0")
        assert "fault injection" in info["health_reason"]
        check = _healthcheck(private_redis, keys)
        assert check.returncode == 1 and "dead" in check.stderr
    finally:
        await r.aclose()


async def test_engine_death_while_idle_is_seen_by_the_heartbeat(
    private_redis: PrivateRedis, keys: Keys, spawn: Any
) -> None:
    r = Redis.from_url(private_redis.url, decode_responses=True)
    try:
        proc = spawn(_env(private_redis, keys, CHIMERA_WORKER_SIM_FAULT_DIE_AFTER_S="2.0"), "idle")
        await _wait(lambda: _registered(r, keys), 30)
        # Before the fix an idle worker went on heartbeating a dead engine as alive.
        assert await _exit_code(proc, 60) != 0
        assert await r.hget(keys.engine_info(ENGINE), "health") == "dead"
        assert _healthcheck(private_redis, keys).returncode == 1
    finally:
        await r.aclose()


async def test_a_lost_registration_is_written_again_without_profiling(
    private_redis: PrivateRedis, keys: Keys, spawn: Any
) -> None:
    r = Redis.from_url(private_redis.url, decode_responses=True)
    try:
        proc = spawn(_env(private_redis, keys), "reregister")
        await _wait(lambda: _registered(r, keys), 30)
        before = await r.hgetall(keys.engine_info(ENGINE))
        # What a Redis restarted without its data (or a FLUSH of this test's keys) leaves.
        await r.delete(keys.engines(), keys.engine_info(ENGINE))
        await _wait(lambda: _registered(r, keys), 10)
        after = await r.hgetall(keys.engine_info(ENGINE))
        for field in ("model", "kind", "max_num_seqs", "profile", "decode_ms_per_token", "max_attempts"):
            assert after[field] == before[field], field
        assert after["health"] == "ok" and _healthcheck(private_redis, keys).returncode == 0
        # Only the set membership lost this time: added back too.
        await r.srem(keys.engines(), ENGINE)
        await _wait(lambda: r.sismember(keys.engines(), ENGINE), 10)
        assert proc.poll() is None
    finally:
        await r.aclose()


def test_the_probe_reads_health_with_decoding_and_raw_clients(
    private_redis: PrivateRedis, keys: Keys
) -> None:
    """The launcher's probe reads with a client that does not decode responses; the container check's does."""
    import redis as sync_redis

    from services.common.health import heartbeat_unhealthy

    info = keys.engine_info(ENGINE)
    for decode in (True, False):
        with sync_redis.Redis.from_url(private_redis.url, decode_responses=decode) as r:
            r.hset(info, mapping={"heartbeat_ms": int(time.time() * 1000), "health": "ok"})
            assert heartbeat_unhealthy(r, keys, ENGINE, 5.0) is None
            r.hset(info, mapping={"health": "dead", "health_reason": "engine core gone"})
            assert heartbeat_unhealthy(r, keys, ENGINE, 5.0) == f"engine {ENGINE} is dead: engine core gone"
            r.delete(info)
