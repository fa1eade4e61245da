"""The worker's delta publisher with a fake store (records what would be published): a request flushed
alone takes only its own text, the others wait for the shared flush, order within a request holds, and
each delta carries its end offset."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from services.common.queue import DeltaItem, QueueStore
from services.worker.publisher import DeltaPublisher

pytestmark = pytest.mark.unit


@dataclass
class Job:
    request_id: str
    attempt: int = 1
    stale: bool = False
    published: int = 0


class FakeStore:
    def __init__(self) -> None:
        self.calls: list[list[tuple[str, int, str, int]]] = []

    async def publish_deltas(self, engine: str, items: Sequence[tuple[str, int, str, int]]) -> list[bool]:
        self.calls.append(list(items))
        return [True] * len(items)


def _publisher() -> tuple[DeltaPublisher, FakeStore]:
    store = FakeStore()
    return DeltaPublisher(cast(QueueStore, cast(Any, store)), "e0", 0.05, 1 << 16), store


async def test_a_request_flushed_alone_leaves_the_others_for_the_shared_flush() -> None:
    pub, store = _publisher()
    a, b, gone = Job("a"), Job("b"), Job("gone", stale=True)
    pub.add(a, "a1")
    pub.add(b, "b1")
    pub.add(a, "a2")
    pub.add(gone, "x")
    await pub.flush(a)
    assert store.calls == [[DeltaItem("a", 1, "a1a2", 4)]]
    pub.add(a, "a3")
    await pub.flush()
    # A stale attempt writes nothing; each delta says where its request's text ends with it.
    assert store.calls[1] == [DeltaItem("b", 1, "b1", 2), DeltaItem("a", 1, "a3", 6)]
    await pub.flush(b)
    await pub.flush()
    assert len(store.calls) == 2  # nothing was left to send


async def test_a_completion_takes_its_requests_pending_text_and_waits_for_a_flush_in_flight() -> None:
    """``flush_with`` hands the request's last text to its completion (one round trip with the final
    event), and never overtakes a flush of its earlier text that is still being written."""
    pub, store = _publisher()
    a, b = Job("a"), Job("b")
    gate = asyncio.Event()
    order: list[str] = []
    publish = store.publish_deltas

    async def slow_publish(engine: str, items: Sequence[tuple[str, int, str, int]]) -> list[bool]:
        await gate.wait()
        order.append("flush")
        return await publish(engine, items)

    store.publish_deltas = slow_publish  # type: ignore[method-assign]
    pub.add(a, "a1")
    pub.add(b, "b1")
    flushing = asyncio.create_task(pub.flush())
    await asyncio.sleep(0)  # the shared flush holds a1 and b1 now
    pub.add(a, "a2")

    async def complete(deltas: list[tuple[str, int, str, int]]) -> bool:
        order.append("complete")
        assert deltas == [DeltaItem("a", 1, "a2", 4)]  # a's text alone, its end after the flush's a1
        return True

    completing = asyncio.create_task(pub.flush_with(a, complete))
    await asyncio.sleep(0)
    assert order == []  # the completion waits for the flush of a1
    gate.set()
    assert await completing
    await flushing
    assert order == ["flush", "complete"]
    assert await pub.flush_with(b, lambda deltas: _done(deltas)) == []  # b had nothing left


async def _done(deltas: list[tuple[str, int, str, int]]) -> list[tuple[str, int, str, int]]:
    return deltas


class OutageStore(FakeStore):
    """Fails the first ``fails`` publishes as Redis down would, and lets text arrive while one is out."""

    def __init__(self, fails: int) -> None:
        super().__init__()
        self.fails = fails
        self.during: Callable[[], None] | None = None

    async def publish_deltas(self, engine: str, items: Sequence[tuple[str, int, str, int]]) -> list[bool]:
        if self.during is not None:
            self.during()
            self.during = None
        if self.fails:
            self.fails -= 1
            raise RedisConnectionError("Redis is down")
        return await super().publish_deltas(engine, items)


async def test_a_flush_that_fails_puts_its_text_back_ahead_of_what_came_meanwhile() -> None:
    """A Redis outage must not leave a gap in a stream: the text of a failed flush goes out with the next
    one, before the text that arrived while it was out, and the end offsets stay those of the text."""
    a, b = Job("a"), Job("b")
    store = OutageStore(fails=1)
    pub = DeltaPublisher(cast(QueueStore, cast(Any, store)), "e0", 0.05, 1 << 16)
    store.during = lambda: pub.add(a, "a2")
    pub.add(a, "a1")
    pub.add(b, "b1")
    with pytest.raises(RedisError):
        await pub.flush()
    assert store.calls == [] and a.published == 0 and b.published == 0
    await pub.flush()
    assert sorted(store.calls[0]) == [DeltaItem("a", 1, "a1a2", 4), DeltaItem("b", 1, "b1", 2)]
    await pub.flush()
    assert len(store.calls) == 1  # nothing left over
