"""Poison requests against the real Lua scripts (a private redis-server): a request is failed only after it
was running in ``max_attempts`` DISTINCT worker deaths, its last chance runs alone so that a neighbour that
crashed beside it is never failed with it, and a live worker whose engine died hands its claims back,
charging only those its engine had started."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from redis.asyncio import Redis
from worker_procs import stage_request

from services.common.keys import Keys
from services.common.queue import QueueStore
from services.common.queue_records import Retention
from services.common.types import Prediction, StageRequest, StageResult

pytestmark = pytest.mark.redis

E = "e0"


def _req(rid: str) -> StageRequest:
    return stage_request(rid)


async def _enqueue(q: QueueStore, rid: str, score: float) -> None:
    assert await q.enqueue(E, _req(rid), Prediction(10, 20), score, time.time(), {})


async def _crash(q: QueueStore, worker: str, n: int) -> list[str]:
    """``worker`` claims up to ``n`` requests and dies: its leases expire and the reaper runs."""
    claimed = await q.claim(E, worker, n, lease_s=0.01)
    await asyncio.sleep(0.03)
    await q.reap(E)
    return [c.request.request_id for c in claimed]


async def _fields(q: QueueStore, rid: str) -> dict[str, str]:
    return await q.request_fields(E, rid)


async def _last_event(r: Redis, keys: Keys, rid: str) -> dict[str, Any]:
    (_sid, f), *_ = await r.xrevrange(keys.output(E, rid), count=1)
    return dict(json.loads(f["ev"]))


async def test_one_worker_cannot_charge_a_request_twice(redis_client: Redis, keys: Keys) -> None:
    q = QueueStore(redis_client, keys, Retention(max_attempts=2))
    await _enqueue(q, "a", 1.0)
    for _ in range(3):  # the same worker's lease lapses three times: one death, not three
        assert await _crash(q, "w1", 1) == ["a"]
    f = await _fields(q, "a")
    assert (f["state"], f["deaths"], f["attempt"]) == ("queued", "1", "3")


async def test_distinct_deaths_fail_it_as_poison_with_a_clear_error(redis_client: Redis, keys: Keys) -> None:
    q = QueueStore(redis_client, keys, Retention(max_attempts=3))
    await _enqueue(q, "a", 1.0)
    for w in ("w1", "w2", "w3"):
        assert await _crash(q, w, 1) == ["a"]
    f = await _fields(q, "a")
    assert (f["state"], f["deaths"], json.loads(f["died_on"])) == ("failed", "3", ["w1", "w2", "w3"])
    ev = await _last_event(redis_client, keys, "a")
    assert ev["t"] == "error" and ev["code"] == "INTERNAL"
    assert "poison" in ev["message"] and "w1, w2, w3" in ev["message"]
    assert int(await redis_client.hget(keys.engine_info(E), "load") or 0) == 0
    assert await redis_client.zcard(keys.queue(E)) == 0


async def test_the_last_chance_runs_alone_so_the_neighbour_survives(redis_client: Redis, keys: Keys) -> None:
    """A poison request and a neighbour crash together twice; then each runs alone, and only the poison
    request (whose own run kills the third worker) is failed."""
    q = QueueStore(redis_client, keys, Retention(max_attempts=3))
    await _enqueue(q, "poison", 1.0)
    await _enqueue(q, "neighbour", 2.0)
    for w in ("w1", "w2"):
        assert await _crash(q, w, 2) == ["poison", "neighbour"]
    assert (await _fields(q, "neighbour"))["deaths"] == "2"

    alone = await q.claim(E, "w3", 2, lease_s=0.01)  # both on their last chance: the first runs alone
    assert [c.request.request_id for c in alone] == ["poison"]
    assert await q.claim(E, "w3", 2, lease_s=5) == []  # nothing runs beside it
    await asyncio.sleep(0.03)
    await q.reap(E)  # w3 dies running it alone
    assert (await _fields(q, "poison"))["state"] == "failed"

    (n,) = await q.claim(E, "w4", 2, lease_s=5)
    assert n.request.request_id == "neighbour"
    assert await q.complete(n, StageResult("ok", "stop", 1, 1), None)
    assert (await _fields(q, "neighbour"))["state"] == "done"
    assert await q.claim(E, "w4", 2, lease_s=5) == []  # nothing left, and nothing isolating any more


async def test_the_last_chance_waits_for_the_engine_to_drain_in_its_place(
    redis_client: Redis, keys: Keys
) -> None:
    q = QueueStore(redis_client, keys, Retention(max_attempts=2))
    await _enqueue(q, "running", 0.5)
    (running,) = await q.claim(E, "w1", 1, lease_s=5)
    await _enqueue(q, "suspect", 1.0)
    await _enqueue(q, "later", 2.0)
    assert await _crash(q, "w0", 1) == ["suspect"]  # one death: its last chance under max_attempts=2
    assert await q.claim(E, "w1", 2, lease_s=5) == []  # neither it nor what is behind it jumps in
    assert await redis_client.zrange(keys.queue(E), 0, -1) == ["suspect", "later"]
    assert await q.complete(running, StageResult("ok", "stop", 1, 1), None)
    assert [c.request.request_id for c in await q.claim(E, "w1", 2, lease_s=5)] == ["suspect"]


async def test_a_live_worker_hands_back_charging_only_what_had_started(
    redis_client: Redis, keys: Keys
) -> None:
    q = QueueStore(redis_client, keys, Retention(max_attempts=3))
    for i, rid in enumerate(("started", "prefetched", "stale")):
        await _enqueue(q, rid, float(i))
    claimed = {c.request.request_id: c for c in await q.claim(E, "w1", 3, lease_s=5)}
    requeued = await q.return_claims(
        E,
        [
            ("started", claimed["started"].attempt, True),
            ("prefetched", claimed["prefetched"].attempt, False),
            ("stale", claimed["stale"].attempt + 1, True),  # an attempt it no longer holds: untouched
        ],
    )
    assert sorted(requeued) == ["prefetched", "started"]
    assert (await _fields(q, "started"))["deaths"] == "1"
    assert "deaths" not in await _fields(q, "prefetched")
    assert (await _fields(q, "stale"))["state"] == "running"
    assert await redis_client.zrange(keys.claims(E), 0, -1) == ["stale"]
    assert await redis_client.zrange(keys.queue(E), 0, -1) == ["started", "prefetched"]


async def test_the_engines_registered_limit_wins_over_the_reapers_default(
    redis_client: Redis, keys: Keys
) -> None:
    """The dispatcher's reaper has only the default; the worker registered max_attempts=1 for its engine."""
    await redis_client.hset(keys.engine_info(E), "max_attempts", 1)
    q = QueueStore(redis_client, keys, Retention(max_attempts=3))
    await _enqueue(q, "a", 1.0)
    await _crash(q, "w1", 1)
    assert (await _fields(q, "a"))["state"] == "failed"


async def test_a_cancelled_request_whose_worker_died_ends_cancelled(redis_client: Redis, keys: Keys) -> None:
    q = QueueStore(redis_client, keys)
    await _enqueue(q, "a", 1.0)
    await q.claim(E, "w1", 1, lease_s=0.01)
    assert await q.cancel(E, "a") == "running"
    await asyncio.sleep(0.03)
    assert await q.reap(E) == []
    assert (await _fields(q, "a"))["state"] == "cancelled"
    ev = await _last_event(redis_client, keys, "a")
    assert (ev["t"], ev["finish_reason"]) == ("final", "cancelled")
