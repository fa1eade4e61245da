"""Streaming back one request across a worker crash, error events and lost requests; the reaper."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

import pytest
from redis.asyncio import Redis

from services.common.keys import Keys
from services.common.queue import QueueStore
from services.common.queue_records import Retention
from services.common.redis_proc import PrivateRedis
from services.common.types import ChatMessage, Prediction, SamplingParams, StageRequest, StageResult
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.dispatch import Dispatcher
from services.dispatcher.errors import RequestFailed
from services.dispatcher.handoff import Delta, Dispatched, Final, StreamItem
from services.dispatcher.reaper import reap_once
from services.dispatcher.stream import stream_output

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


class FakeRouter:
    async def score(self, text: str, workflow: str, models: Sequence[str]) -> Mapping[str, float]:
        return dict.fromkeys(models, 0.5)


class FakePredictor:
    async def predict(self, request: StageRequest, models: Sequence[str]) -> Mapping[str, Prediction]:
        return dict.fromkeys(models, Prediction(50, 90))


def _req(rid: str) -> StageRequest:
    return StageRequest(
        request_id=rid,
        program_id=f"prog-{rid}",
        stage=0,
        workflow="math/solver",
        messages=(ChatMessage("user", "2+2?"),),
        sampling=SamplingParams(max_tokens=8),
        received_unix=time.time(),
    )


async def _setup(private_redis: PrivateRedis, keys: Keys, r: Redis) -> tuple[Dispatcher, QueueStore]:
    await r.sadd(keys.engines(), "e0")
    await r.hset(
        keys.engine_info("e0"),
        mapping={
            "model": "m",
            "decode_ms_per_token": 5,
            "max_batch_size": 4,
            "heartbeat_ms": int(time.time() * 1000),
        },
    )
    store = QueueStore(r, keys, Retention(max_attempts=3))
    settings = DispatcherSettings(redis_url=private_redis.url, key_prefix=keys.prefix)
    return Dispatcher(store, r, FakeRouter(), FakePredictor(), settings), store


async def _drain(dispatcher: Dispatcher, d: Dispatched) -> list[StreamItem]:
    stream = stream_output(dispatcher.hub, dispatcher.store, d, block_ms=50, probe_s=0.1)
    return [item async for item in stream]


async def test_rerun_after_worker_death_streams_the_winning_attempt(
    private_redis: PrivateRedis, keys: Keys, redis_client: Redis
) -> None:
    dispatcher, store = await _setup(private_redis, keys, redis_client)
    d = await dispatcher.dispatch(_req("r1"))
    reader = asyncio.create_task(_drain(dispatcher, d))
    first = (await store.claim("e0", "dying-worker", 1, lease_s=0.05))[0]
    assert await store.publish_delta("e0", "r1", first.attempt, "old-", 4)
    assert not await store.publish_delta("e0", "r1", first.attempt, "old-", 4)  # a retried write
    await asyncio.sleep(0.1)
    assert await reap_once(store, redis_client) == {"e0": ["r1"]}
    second = (await store.claim("e0", "fresh-worker", 1, lease_s=10))[0]
    assert await store.publish_delta("e0", "r1", second.attempt, "new", 3)
    # The dead worker's last gasp is fenced off where it is written.
    assert not await store.publish_delta("e0", "r1", first.attempt, "late", 8)
    assert not await store.complete(first, StageResult("stale", "stop", 1, 1), None)
    assert await store.complete(second, StageResult("new", "stop", 3, 1), None)
    items = await asyncio.wait_for(reader, 10)
    assert items[:2] == [Delta("old-", 1), Delta("new", 2)]
    final = items[-1]
    assert isinstance(final, Final) and len(items) == 3
    assert (final.text, final.attempts, final.engine, final.predicted_tokens) == ("new", 2, "e0", 50)
    assert final.queue_wait_s >= 0 and final.e2e_s > 0


async def test_error_event_raises_with_its_code(
    private_redis: PrivateRedis, keys: Keys, redis_client: Redis
) -> None:
    dispatcher, store = await _setup(private_redis, keys, redis_client)
    d = await dispatcher.dispatch(_req("r2"))
    claimed = (await store.claim("e0", "w", 1, lease_s=10))[0]
    assert await store.fail(claimed, "RESOURCE_EXHAUSTED", "context too long")
    with pytest.raises(RequestFailed) as err:
        await _drain(dispatcher, d)
    assert err.value.code == "RESOURCE_EXHAUSTED"


async def test_lost_request_ends_the_stream(
    private_redis: PrivateRedis, keys: Keys, redis_client: Redis
) -> None:
    dispatcher, store = await _setup(private_redis, keys, redis_client)
    d = await dispatcher.dispatch(_req("r3"))
    await redis_client.delete(keys.request("e0", "r3"))  # as if its retention had expired
    with pytest.raises(RequestFailed) as err:
        await asyncio.wait_for(_drain(dispatcher, d), 10)
    assert err.value.code == "UNAVAILABLE"
