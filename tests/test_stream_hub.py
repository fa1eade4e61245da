"""The stream hub on real Redis: one blocking read serves every open stream, and a stream on an engine the
read does not cover yet is not left waiting for that read's timeout."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

from services.common.keys import Keys
from services.common.queue import QueueStore
from services.dispatcher.hub import StreamHub

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

BLOCK_MS = 5000  # far above anything a delivery should take


async def _first_event_s(hub: StreamHub, store: QueueStore, engine: str, rid: str) -> float:
    async with hub.subscribe(engine, rid) as sub:
        t0 = time.perf_counter()
        await store.publish_delta(engine, rid, 1, "hello")
        events = await hub.next(sub, BLOCK_MS / 1000)
        assert [e.data.get("text") for e in events] == ["hello"]
        return time.perf_counter() - t0


async def test_a_stream_on_a_new_engine_interrupts_the_read(redis_client: Redis, keys: Keys) -> None:
    store = QueueStore(redis_client, keys)
    reader = Redis(connection_pool=redis_client.connection_pool)
    hub = StreamHub(store, reader, BLOCK_MS)
    try:
        async with hub.subscribe("e0", "quiet"):  # the hub now blocks on e0's notify stream alone
            await asyncio.sleep(0.2)
            assert await _first_event_s(hub, store, "e1", "r1") < 1.0
        # e0's last stream closed while a read was blocked on it: a stream on e1 must not wait it out.
        await asyncio.sleep(0.2)
        assert await _first_event_s(hub, store, "e1", "r2") < 1.0
        assert await _first_event_s(hub, store, "e0", "r3") < 1.0
        assert hub.open_streams == 0
    finally:
        await hub.stop()
