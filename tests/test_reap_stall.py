"""A Redis stall is not a dead worker (real Lua scripts, a private redis-server): when no reaper reached an
engine for longer than its worker's lease, the next REAP holds its round so that live workers renew first;
a worker that really died is reaped the round after."""

from __future__ import annotations

import asyncio
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


async def test_the_dispatchers_reaper_stops_on_its_event_and_hands_its_lease_back(
    redis_client: Redis, keys: Keys
) -> None:
    # NOTE(cancel) in services.common.redis_conn: it must stop without being cancelled, between rounds or
    # in one, and leave the lease free for another replica at once.
    stop = asyncio.Event()
    task = asyncio.create_task(reap_forever(QueueStore(redis_client, keys), redis_client, 0.05, "r1", stop))
    for _ in range(100):
        if await redis_client.get(keys.reaper_lease()) == "r1":
            break
        await asyncio.sleep(0.02)
    assert await redis_client.get(keys.reaper_lease()) == "r1"
    await asyncio.sleep(0.12)  # a few rounds
    stop.set()
    done, _ = await asyncio.wait({task}, timeout=2.0)
    assert done == {task} and task.exception() is None
    assert await redis_client.get(keys.reaper_lease()) is None
