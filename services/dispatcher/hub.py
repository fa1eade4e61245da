"""``StreamHub``: one reader per dispatcher process for the output streams of every request it serves.

NOTE(hub): an open stream must not cost a Redis connection: with one blocking XREAD per stream, a pool of
100 connections held 100 streams and the 101st caller got "Too many connections". Instead every output
event is also copied into its engine's notify stream (``Keys.notify``, by the same Lua script that appends
the event). The hub's loop reads the notify streams of the engines it streams from with ONE blocking XREAD
on its own connection and hands each copy to the subscriber of its request, if this process has one. A
subscriber waits on an in-process event, nothing else. A worker's flush of deltas is one notify entry for
all its requests (field 'm', ``queue_scripts.PUBLISH``); every other event is one entry of its own.

The read covers every engine this process streamed from in the last minute, not only those with a
subscription open right now: a read over only the engines of the moment can block for its whole timeout
while new subscriptions on another engine wait (measured: one-stage requests stalled 1.1 s at the p99).
A subscription on an engine the read does not cover yet interrupts it. On a Redis Cluster the one read is
one read per engine instead (``slot_reads``: a cluster refuses a read across slots).

Nothing is lost in between: a subscription reads its request's own stream when it opens (its backlog),
unless the dispatcher announced the request before enqueueing it (``expect``): the hub then holds its events
from before the first one can exist, and the stream opening on it adopts them without a read of its own;
the loop starts a newly read notify stream a few seconds in the past (a copy delivered twice is dropped by
its stream id); and a subscriber that hears nothing for ``probe_s`` reads its stream directly (``poll``),
which also covers copies trimmed away while the hub was behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.typing import KeyT, StreamIdT

from services.common.keys import Keys
from services.common.queue import QueueStore
from services.common.queue_records import READ_BATCH, OutputEvent
from services.common.redis_client import is_cluster
from services.dispatcher.errors import REDIS_DOWN, StoreUnavailable, guarded
from services.dispatcher.slot_reads import SlotReads

log = logging.getLogger(__name__)

# How far back a notify stream is first read: covers the time between a subscription's own backlog fetch
# and the loop's first read of its engine (one blocking read at most), with room for clock skew.
_LOOKBACK_MS = 5000
_RETRY_S = 0.5
# An engine nobody streams from is still read this long, so the next stream on it needs no interruption.
_KEEP_S = 60.0
_READ_COUNT = 10_000
# An expected request whose stream has not opened this long is forgotten (its caller went away between the
# dispatch and the stream); a stream opening on it later reads its backlog as any other does.
_EXPECT_S = 10.0


@dataclass(eq=False)
class Subscription:
    engine: str
    request_id: str
    after: str = "0"  # stream id of the last event delivered
    pending: list[OutputEvent] = field(default_factory=list)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    error: BaseException | None = None
    # While its stream is read directly, the hub's copies wait here: delivered first, a later copy would
    # make the read's earlier events look old (one whose copy the hub saw before the subscription existed
    # was dropped, and the text lost its first delta).
    syncing: bool = False
    held: list[OutputEvent] = field(default_factory=list)

    def offer(self, events: list[OutputEvent]) -> None:
        if self.syncing:
            self.held.extend(events)
        else:
            self.deliver(events)

    def deliver(self, events: list[OutputEvent]) -> None:
        fresh = [e for e in events if _newer(e.stream_id, self.after)]
        if fresh:
            self.after = fresh[-1].stream_id
            self.pending.extend(fresh)
            self.ready.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.ready.set()


def _newer(a: str, b: str) -> bool:
    """Stream id ``a`` comes after ``b`` ("ms-seq"; "0" is before everything)."""
    ams, _, aseq = a.partition("-")
    bms, _, bseq = b.partition("-")
    return (int(ams), int(aseq or 0)) > (int(bms), int(bseq or 0))


class StreamHub:
    def __init__(
        self,
        store: QueueStore,
        reader: Redis,
        block_ms: int = 1000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``reader`` is the client of the one blocking read (its own connection in production)."""
        self._store = store
        self._keys: Keys = store.keys
        self._reader = reader
        self._block_ms = block_ms
        self._slot_reads = SlotReads(reader, block_ms, _READ_COUNT) if is_cluster(reader) else None
        self._clock = clock
        # Request -> its open subscriptions: usually one; two while a retry re-attaches in this process
        # before the stream it replaces has closed (each must keep hearing until it closes itself).
        self._subs: dict[tuple[str, str], list[Subscription]] = {}
        self._cursor: dict[KeyT, StreamIdT] = {}  # notify stream -> id read up to
        # Engine read -> when its last subscription closed (monotonic; inf while any is open). Kept up to
        # date by subscribe, so a round never walks the (thousands of) subscriptions.
        self._engines: dict[str, float] = {}
        self._open: Counter[str] = Counter()  # open subscriptions per engine
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._grown = asyncio.Event()  # a subscription on an engine the current read does not cover
        self._later: set[asyncio.Task[None]] = set()
        # Subscriptions made by ``expect`` that no stream has adopted yet -> when (monotonic).
        self._expected: dict[tuple[str, str], tuple[Subscription, float]] = {}

    def later(self, delay_s: float, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` after ``delay_s`` (a stream's deferred cancel); dropped if the hub stops first."""

        async def run() -> None:
            try:
                await asyncio.sleep(delay_s)
            except asyncio.CancelledError:
                work.close()  # never started: close it, or Python warns it was never awaited
                raise
            await work

        task = asyncio.get_running_loop().create_task(run())
        self._later.add(task)
        task.add_done_callback(self._later.discard)

    @property
    def open_streams(self) -> int:
        return sum(self._open.values()) - len(self._expected)

    def expect(self, engine: str, request_id: str) -> None:
        """Hold the events of a request about to be enqueued, for the stream that will open on it: called
        before the request can have any, it spares that stream the read of its backlog."""
        self.unexpect(engine, request_id)  # a re-dispatch of the same id replaces its announcement
        sub = self._register(Subscription(engine, request_id))
        self._expected[(engine, request_id)] = (sub, time.monotonic())

    def unexpect(self, engine: str, request_id: str) -> None:
        """The announced request was not enqueued after all."""
        if (held := self._expected.pop((engine, request_id), None)) is not None:
            self._unregister(held[0])

    @contextlib.asynccontextmanager
    async def subscribe(self, engine: str, request_id: str) -> AsyncIterator[Subscription]:
        """Register for a request's events for the duration of the block; its backlog is fetched first,
        unless the request was expected (``expect``)."""
        held = self._expected.pop((engine, request_id), None)
        sub = held[0] if held is not None else self._register(Subscription(engine, request_id))
        try:
            if held is None:
                await self.poll(sub)
            yield sub
        finally:
            self._unregister(sub)

    def _register(self, sub: Subscription) -> Subscription:
        self._subs.setdefault((sub.engine, sub.request_id), []).append(sub)
        if sub.engine not in self._engines:
            self._grown.set()
        self._engines[sub.engine] = math.inf
        self._open[sub.engine] += 1
        self._ensure_running()
        return sub

    def _unregister(self, sub: Subscription) -> None:
        engine, key = sub.engine, (sub.engine, sub.request_id)
        subs = self._subs.get(key, [])
        if sub not in subs:
            return
        subs.remove(sub)
        if not subs:
            del self._subs[key]
        self._open[engine] -= 1
        if not self._open[engine]:
            del self._open[engine]
            self._engines[engine] = time.monotonic()

    async def next(self, sub: Subscription, timeout_s: float) -> list[OutputEvent]:
        """The events delivered since the last call, waiting up to ``timeout_s`` for the first."""
        if not sub.pending and sub.error is None:
            # asyncio.timeout, not wait_for: wait_for wraps the wait in a task of its own, and this runs
            # once per relayed message (profiled: task creation was a visible share of the relay).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await sub.ready.wait()
        if sub.error is not None:
            raise sub.error
        events, sub.pending = sub.pending, []
        sub.ready.clear()
        return events

    async def poll(self, sub: Subscription) -> None:
        """Fetch the subscription's new events directly (its backlog, or after a long silence)."""
        key = (sub.engine, sub.request_id)
        sub.syncing = True
        try:
            while True:
                events = (await guarded(self._store.read_many({key: sub.after}))).get(key, [])
                sub.deliver(events)
                if len(events) < READ_BATCH:
                    return
        finally:
            sub.syncing = False
            held, sub.held = sub.held, []
            sub.deliver(held)

    async def _read(self) -> Any:
        """One blocking read of the notify streams; None if a subscription on a new engine cut it short."""
        if self._slot_reads is not None:
            return await self._slot_reads.read(self._cursor, self._grown)
        read = asyncio.ensure_future(
            self._reader.xread(self._cursor, block=self._block_ms, count=_READ_COUNT)
        )
        if self._grown.is_set():
            grown: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            grown.set_result(True)
        else:
            grown = asyncio.ensure_future(self._grown.wait())
        # A read abandoned below (or by the hub stopping) may still fail as its connection drops: that is
        # expected, so its error is retrieved here rather than reported by asyncio as never retrieved.
        read.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            await asyncio.wait({read, grown}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            grown.cancel()
            if not read.done() and self._stopping:
                read.cancel()
        if read.done():
            return read.result()
        # Rare (a first stream on an engine): cancelling drops the blocked connection (the next read opens
        # another), which may surface as a connection error here rather than as the cancellation.
        read.cancel()
        with contextlib.suppress(asyncio.CancelledError, *REDIS_DOWN):
            await read
        return None

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._stopping = False
            self._task = asyncio.create_task(self._run(), name="stream-hub")

    async def stop(self) -> None:
        self._stopping = True
        for task in list(self._later):
            task.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(self._task, 5.0)
            self._task = None
        if self._slot_reads is not None:
            await self._slot_reads.close()

    async def _run(self) -> None:
        while not self._stopping:
            try:
                await self._round()
            except asyncio.CancelledError:
                raise
            except REDIS_DOWN as e:
                # Every subscriber learns at once that Redis went away, as a direct reader would.
                log.warning("stream hub cannot read Redis: %s", e)
                for sub in [s for subs in self._subs.values() for s in subs]:
                    sub.fail(StoreUnavailable(f"redis is unreachable: {e}"))
                await asyncio.sleep(_RETRY_S)
            except Exception:
                log.exception("stream hub round failed")
                await asyncio.sleep(_RETRY_S)

    async def _round(self) -> None:
        self._grown.clear()  # before the engines are listed: a subscription after this sets it again
        now = time.monotonic()
        for key in [k for k, (_, t) in self._expected.items() if now - t > _EXPECT_S]:
            self.unexpect(*key)
        # Engines nobody streamed from for a while are forgotten: read again later, they start afresh.
        self._engines = {e: t for e, t in self._engines.items() if now - t < _KEEP_S}
        names = {self._keys.notify(e): e for e in sorted(self._engines)}
        self._cursor = {k: v for k, v in self._cursor.items() if k in names}
        if not names:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._grown.wait(), self._block_ms / 1000.0)
            return
        start = f"{int(self._clock() * 1000) - _LOOKBACK_MS}-0"
        for stream in names:
            self._cursor.setdefault(stream, start)
        res = await self._read()
        if self._stopping or res is None:
            return
        for stream, entries in res or []:
            self._cursor[stream] = entries[-1][0]
            engine = names[stream]
            for _, fields in entries:
                if "m" in fields:  # a worker's flush: many requests' deltas in one entry (PUBLISH)
                    for rid, sid, event in json.loads(fields["m"]):
                        for sub in self._subs.get((engine, rid), ()):
                            sub.offer([OutputEvent(sid, event)])
                else:
                    for sub in self._subs.get((engine, fields["r"]), ()):
                        sub.offer([OutputEvent(fields["i"], json.loads(fields["e"]))])
