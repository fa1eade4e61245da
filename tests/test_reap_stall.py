"""A Redis stall is not a dead worker (real Lua scripts, a private redis-server): when no reaper reached an
engine for longer than its worker's lease, the next REAP holds its round so that live workers renew first;
a worker that really died is reaped the round after."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from redis.asyncio import Redis
from worker_procs import stage_request

from services.common.keys import EngineField, Keys
from services.common.queue import QueueStore
from services.common.types import Prediction
from services.dispatcher.reaper import reap_forever

pytestmark = pytest.mark.redis

E = "e0"
LEASE_S = 0.3


async def _running(q: QueueStore, rid: str) -> int:
    assert await q.enqueue(E, stage_request(rid), Prediction(10, 20), 1.0, time.time(), {})
    (claimed,) = await q.claim(E, "w", 1, lease_s=LEASE_S)
    return claimed.attempt


async def _state(r: Redis, keys: Keys, rid: str) -> str:
    return str(await r.hget(keys.request(E, rid), "state"))


async def test_a_stall_holds_one_round_and_a_dead_worker_is_reaped_after_it(
    redis_client: Redis, keys: Keys
) -> None:
    q = QueueStore(redis_client, keys)
    await redis_client.hset(keys.engine_info(E), mapping={"model": "m", EngineField.LEASE_MS: 300})
    live, dead = await _running(q, "live"), await _running(q, "dead")
    assert await q.reap(E) == []  # the last time a reaper reached the engine before the "stall"
    await asyncio.sleep(LEASE_S * 2)  # nobody reaps and nobody renews: as if Redis had been paused
    assert await q.reap(E) == [], "right after a stall, expired leases prove nothing"
    assert await _state(redis_client, keys, "live") == "running"
    assert (await q.renew(E, {"live": live}, LEASE_S * 10)).lost == frozenset()  # the live worker renews
    assert await q.reap(E) == ["dead"]  # the next round: only the worker that did not renew
    assert await _state(redis_client, keys, "live") == "running"
    assert await _state(redis_client, keys, "dead") == "queued"
    assert dead == 1


async def test_without_a_stall_an_expired_lease_is_reaped_at_once(redis_client: Redis, keys: Keys) -> None:
    q = QueueStore(redis_client, keys)
    await redis_client.hset(keys.engine_info(E), mapping={"model": "m", EngineField.LEASE_MS: 5000})
    await _running(q, "r")
    assert await q.reap(E) == []
    await asyncio.sleep(LEASE_S * 1.5)
    assert await q.reap(E) == ["r"]


async def test_the_dispatchers_reaper_stops_when_cancelled_and_hands_its_lease_back(
    redis_client: Redis, keys: Keys
) -> None:
    # How DispatcherServer.stop ends it. Cancelled at random points, rounds in flight included, it must stop
    # every time: on redis-py's own connections most such cancellations were lost and the stop hung
    # (NOTE(cancel) in services.common.redis_conn).
    rng = random.Random(3)
    store = QueueStore(redis_client, keys)
    for _ in range(20):
        task = asyncio.create_task(reap_forever(store, redis_client, 0.001, "r1"))
        await asyncio.sleep(rng.random() * 0.01)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=2.0)
        assert done == {task} and task.cancelled()
        assert await redis_client.get(keys.reaper_lease()) is None
