"""``DeltaPublisher``: the text every running request produced since the last flush, in one round trip.

NOTE(publisher): relaying tokens is most of what Chimera's own processes spend per token (one stream entry,
one read and one gRPC message each), and an engine produces a token for every running sequence at every
step. So requests never write their own deltas: they append to the publisher, which flushes everything
pending every ``interval_s`` (or sooner once ``max_chars`` wait) as one pipeline of PUBLISH scripts: one
stream entry per request per flush, whatever the batch size and the token rate. The worker flushes a
request's first text at once, so coalescing never delays the time to first token, and hands a request's
own pending text to its completion (``flush_with``), which writes it ahead of the final event in the same
round trip: every delta stays ahead of the final event without a round trip of its own. The store
writes a delta only while its attempt holds the request (``queue_scripts.PUBLISH``), and once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from redis.exceptions import RedisError

from services.common.chat import ToolCallPiece, merge_pieces, piece_chars
from services.common.queue import DeltaItem, QueueStore

log = logging.getLogger(__name__)
T = TypeVar("T")


class Source(Protocol):
    """What the publisher needs of a running request (the worker's job)."""

    @property
    def request_id(self) -> str: ...

    @property
    def attempt(self) -> int: ...

    @property
    def stale(self) -> bool:
        """Its lease is gone: a stale attempt must not write into the stream of the one replacing it."""
        ...

    # Characters of its text published so far: each delta is sent with where it ends, which makes a
    # retried write idempotent (PUBLISH drops a delta that is already in).
    published: int


@dataclass(eq=False)
class _Pending:
    source: Source
    parts: list[str] = field(default_factory=list)
    # Tool-call pieces follow the text pending with them: an engine's tool calls come after its content.
    pieces: list[ToolCallPiece] = field(default_factory=list)
    chars: int = 0  # of its text and pieces (piece_chars): what it adds to the attempt's position


class DeltaPublisher:
    def __init__(self, store: QueueStore, engine_id: str, interval_s: float, max_chars: int) -> None:
        self._store = store
        self._engine = engine_id
        self._interval_s = interval_s
        self._max_chars = max_chars
        self._pending: dict[int, _Pending] = {}
        self._chars = 0
        self._soon = asyncio.Event()
        self._some = asyncio.Event()  # set while _pending holds text: the flush loop sleeps until then
        self._lock = asyncio.Lock()  # one flush at a time keeps each request's deltas in order
        self.flushes = 0
        self.entries = 0

    def add(self, source: Source, text: str, pieces: Sequence[ToolCallPiece] = ()) -> None:
        """Queue ``text`` and tool-call ``pieces`` of ``source`` for the next flush (sooner once
        ``max_chars`` wait)."""
        size = len(text) + sum(piece_chars(x) for x in pieces)
        if not size:
            return
        p = self._pending.setdefault(id(source), _Pending(source))
        if text:
            p.parts.append(text)
        p.pieces.extend(pieces)
        p.chars += size
        self._chars += size
        self._some.set()
        if self._chars >= self._max_chars:
            self._soon.set()

    async def flush(self, source: Source | None = None) -> None:
        """Send what is pending now, of every request or of ``source`` alone (and wait for it).

        A request's first text goes out alone: flushing every request's text whenever one starts would
        shrink everyone's coalescing window to the gap between starts."""
        async with self._lock:
            if source is None:
                batch, self._pending, self._chars = list(self._pending.values()), {}, 0
                self._soon.clear()
                self._some.clear()
            else:
                batch = self._take(source)
            items = self._items(batch)
            if not items:
                return
            try:
                await self._store.publish_deltas(self._engine, items)
            except RedisError:
                self._put_back(batch)  # sent with the next flush: a Redis outage leaves no gap in a stream
                raise

    def _put_back(self, batch: list[_Pending]) -> None:
        """Return a failed flush's text to the front of what is pending, its position taken back."""
        for p in batch:
            if p.source.stale:
                continue
            p.source.published -= p.chars
            later = self._pending.get(id(p.source))  # text added while the flush was out comes after
            if later is not None:
                p.parts += later.parts
                p.pieces += later.pieces
                p.chars += later.chars
                self._chars -= later.chars
            self._pending[id(p.source)] = p
            self._chars += p.chars
        if self._pending:
            self._some.set()

    async def flush_with(self, source: Source, send: Callable[[list[DeltaItem]], Awaitable[T]]) -> T:
        """Hand ``source``'s pending text to ``send``, its completion, which writes it ahead of the final
        event in the same round trip (``QueueStore.complete``'s ``deltas``).

        Under the flush lock, like ``flush``: a flush of its earlier text still in flight on another
        connection could otherwise land after these later deltas, and PUBLISH would drop it as already in.
        """
        async with self._lock:
            return await send(self._items(self._take(source)))

    def _take(self, source: Source) -> list[_Pending]:
        """``source``'s pending text, taken out of what the next flush sends."""
        one = self._pending.pop(id(source), None)
        if one is None:
            return []
        self._chars -= one.chars
        if not self._pending:
            self._some.clear()
        return [one]

    def _items(self, batch: list[_Pending]) -> list[DeltaItem]:
        """The deltas to write, counted as sent; a stale attempt's text is dropped."""
        items = []
        for p in batch:
            if p.source.stale:
                continue
            p.source.published += p.chars
            pieces = merge_pieces(p.pieces)
            items.append(
                DeltaItem(p.source.request_id, p.source.attempt, "".join(p.parts), p.source.published, pieces)
            )
        if items:
            self.flushes += 1
            self.entries += len(items)
        return items

    async def run(self, closing: asyncio.Event) -> None:
        """Flush every ``interval_s`` (sooner when asked) until ``closing`` is set. With nothing pending it
        sleeps until text or ``closing`` comes instead of waking every interval: those wake-ups were a
        large part of an idle worker's CPU."""
        while not closing.is_set():
            if not self._some.is_set():
                waits = [asyncio.ensure_future(self._some.wait()), asyncio.ensure_future(closing.wait())]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
                continue
            # asyncio.timeout, not wait_for: wait_for wraps the wait in a task of its own, once per flush.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval_s):
                    await self._soon.wait()
            try:
                await self.flush()
            except RedisError as e:
                # Put back (flush): they go out with the next flush, or with the final event.
                log.warning("could not publish deltas: %s", e)
