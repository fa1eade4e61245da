"""The stream hub on real Redis: one blocking read serves every open stream, and a stream on an engine the
read does not cover yet is not left waiting for that read's timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest
from redis.asyncio import Redis
from worker_procs import stage_request

from services.common.keys import Keys
from services.common.queue import QueueStore
from services.common.types import Prediction
from services.dispatcher.hub import StreamHub

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

BLOCK_MS = 5000  # far above anything a delivery should take


async def _publish(store: QueueStore, engine: str, rid: str, text: str) -> None:
    """A delta of a running request (PUBLISH writes only for the attempt that holds it): queued and
    claimed first if it is not running yet."""
    if not await store.redis.exists(store.keys.request(engine, rid)):
        assert await store.enqueue(engine, stage_request(rid), Prediction(5, 5), 1.0, time.time(), {})
        assert [c.request.request_id for c in await store.claim(engine, "w", 1, lease_s=30)] == [rid]
    sent = await store.redis.hget(store.keys.request(engine, rid), "sent")
    end = int(sent or 0)
    assert await store.publish_delta(engine, rid, 1, text, end + len(text))


async def _first_event_s(hub: StreamHub, store: QueueStore, engine: str, rid: str) -> float:
    async with hub.subscribe(engine, rid) as sub:
        t0 = time.perf_counter()
        await _publish(store, engine, rid, "hello")
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


class _SlowRead(QueueStore):
    """Real store whose direct reads finish only after ``during`` ran (the hub delivering meanwhile)."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        super().__init__(redis, keys)
        self.during: list[Callable[[], Awaitable[None]]] = []

    async def read_many(self, after: Mapping[tuple[str, str], str]) -> Any:
        got = await super().read_many(after)
        while self.during:
            await self.during.pop(0)()
        return got


async def test_a_copy_the_hub_delivers_during_the_backlog_read_loses_nothing(
    redis_client: Redis, keys: Keys
) -> None:
    store = _SlowRead(redis_client, keys)
    hub = StreamHub(store, Redis(connection_pool=redis_client.connection_pool), BLOCK_MS)
    try:
        async with hub.subscribe("e0", "other"):
            await asyncio.sleep(0.2)
            # The first delta's copy reaches the hub before anyone subscribed to "r": it is dropped there.
            await _publish(store, "e0", "r", "one ")
            await asyncio.sleep(0.3)

            async def second_arrives_via_the_hub() -> None:
                await _publish(store, "e0", "r", "two")
                await asyncio.sleep(0.3)

            store.during.append(second_arrives_via_the_hub)
            async with hub.subscribe("e0", "r") as sub:
                events = await hub.next(sub, 1.0)
        assert "".join(e.data.get("text", "") for e in events) == "one two"
    finally:
        await hub.stop()


class _CountedReads(QueueStore):
    """Real store that counts the hub's direct reads of request streams (backlog fetches and probes)."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        super().__init__(redis, keys)
        self.reads = 0

    async def read_many(self, after: Mapping[tuple[str, str], str]) -> Any:
        self.reads += 1
        return await super().read_many(after)


async def test_an_expected_request_streams_everything_without_a_backlog_read(
    redis_client: Redis, keys: Keys
) -> None:
    """The dispatcher announces a request before enqueueing it: its first events, written before its
    stream opens, still reach that stream, which reads nothing itself; an announcement nobody adopts is
    not an open stream, and one withdrawn or expired leaves a later stream on the request to read its
    backlog as usual."""
    store = _CountedReads(redis_client, keys)
    hub = StreamHub(store, Redis(connection_pool=redis_client.connection_pool), BLOCK_MS)
    try:
        async with hub.subscribe("e0", "busy"):  # the hub is reading e0 already
            await asyncio.sleep(0.2)
            store.reads = 0
            hub.expect("e0", "r")
            assert hub.open_streams == 1  # "busy" alone: an announcement is not a stream yet
            await _publish(store, "e0", "r", "one ")
            await _publish(store, "e0", "r", "two")
            await asyncio.sleep(0.3)  # both copies reach the hub before the stream opens
            async with hub.subscribe("e0", "r") as sub:
                assert hub.open_streams == 2
                events = await hub.next(sub, 1.0)
            assert "".join(e.data.get("text", "") for e in events) == "one two"
            assert store.reads == 0

            hub.expect("e0", "withdrawn")
            hub.unexpect("e0", "withdrawn")
            await _publish(store, "e0", "withdrawn", "kept in its stream")
            async with hub.subscribe("e0", "withdrawn") as sub:
                events = await hub.next(sub, 1.0)
            assert [e.data.get("text") for e in events] == ["kept in its stream"]
            assert store.reads == 1  # its backlog, read as for any stream nobody announced
        assert hub.open_streams == 0 and not hub._subs
    finally:
        await hub.stop()


async def test_an_announcement_no_stream_adopts_is_forgotten(
    redis_client: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller gone between its dispatch and its stream leaves nothing held in the hub for long."""
    monkeypatch.setattr("services.dispatcher.hub._EXPECT_S", 0.2)
    hub = StreamHub(QueueStore(redis_client, keys), Redis(connection_pool=redis_client.connection_pool), 100)
    try:
        hub.expect("e0", "never-streamed")
        await asyncio.sleep(0.6)  # a few of the hub's rounds
        assert not hub._subs and not hub._expected
    finally:
        await hub.stop()


async def test_a_retry_streaming_the_same_request_keeps_hearing_after_the_old_stream_closes(
    redis_client: Redis, keys: Keys
) -> None:
    """A retry re-attaches in this process before the stream it replaces has closed: both hear the events
    while open, and the old one closing does not silence the new one (before, the second subscription
    replaced the first, and the first's exit removed the second: it heard nothing until its 5 s probe)."""
    store = QueueStore(redis_client, keys)
    hub = StreamHub(store, Redis(connection_pool=redis_client.connection_pool), BLOCK_MS)
    try:
        async with hub.subscribe("e0", "r") as new:
            async with hub.subscribe("e0", "r") as old:
                await _publish(store, "e0", "r", "one ")
                assert [e.data["text"] for e in await hub.next(old, 1.0)] == ["one "]
                assert [e.data["text"] for e in await hub.next(new, 1.0)] == ["one "]
            assert hub.open_streams == 1
            await _publish(store, "e0", "r", "two")
            assert [e.data["text"] for e in await hub.next(new, 1.0)] == ["two"]
        assert hub.open_streams == 0 and not hub._subs
    finally:
        await hub.stop()
