"""Streaming one request's output back to its caller from the request's Redis Stream.

NOTE(stream): the stream, not an in-process channel, carries the output, so any front-door replica can
serve it and a reconnecting reader misses nothing. The process's ``StreamHub`` reads it (one blocking read
for all open streams). A request that is re-run after its worker died emits
deltas with a higher ``attempt``; earlier attempts' late deltas are dropped here, and the caller, seeing a
higher attempt, discards text it already has. If the caller goes away or its deadline passes, the request
is cancelled so that the engine stops spending tokens on it: at once past its deadline, else after a grace
in which the caller's retry may re-attach to it (``reattach.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from services.common.chat import ToolCallPiece, merge_pieces, tool_calls_of
from services.common.queue import QueueStore
from services.common.queue_records import OutputEvent
from services.dispatcher.errors import (
    REDIS_DOWN,
    DeadlineExceeded,
    DispatchError,
    RequestFailed,
    guarded,
)
from services.dispatcher.handoff import Delta, Dispatched, Final, StreamItem
from services.dispatcher.hub import StreamHub

log = logging.getLogger(__name__)
# What may stop a best-effort cancel: the caller's own cancellation, or Redis being away.
_CANCEL_FAILED: tuple[type[BaseException], ...] = (asyncio.CancelledError, *REDIS_DOWN)


async def stream_output(
    hub: StreamHub,
    store: QueueStore,
    d: Dispatched,
    block_ms: int = 1000,
    probe_s: float = 5.0,
    detach_grace_s: float = 3.0,
    clock: Callable[[], float] = time.time,
) -> AsyncIterator[StreamItem]:
    """Yield deltas, then exactly one ``Final``; raise ``RequestFailed`` on an error event.

    Raises ``DeadlineExceeded`` once the request's deadline passes (the request is cancelled first). After
    ``probe_s`` without an event it reads the stream itself and checks that the request still exists. A
    stream left before its end has its request cancelled ``detach_grace_s`` later, unless a retry of the
    request re-attached to it by then.
    """
    rid, engine = d.request.request_id, d.engine
    relay, reported = _Relay(d, clock), False
    ended_by: BaseException | None = None  # None: the caller stopped reading
    try:
        async with hub.subscribe(engine, rid) as sub:
            silent_s = 0.0
            while True:
                wait_ms = _wait_ms(d, block_ms, clock)
                events = await hub.next(sub, wait_ms / 1000.0)
                if events:
                    silent_s = 0.0
                    for item in relay.items(events):
                        if isinstance(item, Final):
                            reported = _report(d, item)
                        yield item
                    if relay.error is not None:
                        raise relay.error
                    if relay.finished:
                        return
                    continue
                silent_s += wait_ms / 1000.0
                if silent_s >= probe_s:
                    silent_s = 0.0
                    await hub.poll(sub)  # an announcement the hub missed
                    # Cheap liveness probe (never the whole hash: it holds the prompt).
                    if not sub.pending and not await guarded(
                        store.redis.exists(store.keys.request(engine, rid))
                    ):
                        relay.finished = True
                        raise RequestFailed("UNAVAILABLE", f"request {rid} expired before it finished")
    except Exception as e:
        ended_by = e
        reported = _report(d, e.code if isinstance(e, DispatchError) else "INTERNAL")
        raise
    finally:
        if not reported:
            _report(d, None)  # the caller went away (or was cancelled) before the end
        if not relay.finished:
            if isinstance(ended_by, DeadlineExceeded):
                await _cancel_quietly(store, engine, rid)
            else:
                # The caller went away, or this process lost Redis: its retry may re-attach (reattach.py).
                hub.later(detach_grace_s, _cancel_unless_reattached(store, engine, rid, clock()))


class _Relay:
    """Output events -> what the caller sees: deltas of the newest attempt, merged when they arrive together
    (fewer messages, the same text), then one ``Final`` or an ``error``."""

    def __init__(self, d: Dispatched, clock: Callable[[], float]) -> None:
        self._d, self._clock = d, clock
        self.best_attempt = 0
        self.finished = False
        self.error: RequestFailed | None = None  # raised once the deltas before it have gone out

    def items(self, events: list[OutputEvent]) -> list[StreamItem]:
        out: list[StreamItem] = []
        text: list[str] = []
        pieces: list[ToolCallPiece] = []

        def merged() -> None:
            if text or pieces:
                out.append(Delta("".join(text), self.best_attempt, merge_pieces(pieces)))
                text.clear()
                pieces.clear()

        for ev in events:
            kind, attempt = ev.data.get("t"), int(ev.data.get("a", 0))
            if kind == "delta":
                if attempt < self.best_attempt:
                    continue  # a late delta from a worker whose lease was lost
                if attempt > self.best_attempt:
                    merged()
                self.best_attempt = attempt
                if pieces and ev.data.get("text"):
                    merged()  # text after a tool call's pieces stays after them
                text.append(str(ev.data.get("text", "")))
                pieces.extend(ToolCallPiece.from_wire(p) for p in ev.data.get("tc", ()))
                continue
            merged()
            if kind == "error":
                self.finished = True
                self.error = RequestFailed(
                    str(ev.data.get("code", "INTERNAL")), str(ev.data.get("message", ""))
                )
                return out
            if kind == "final":
                self.finished = True
                out.append(_final(self._d, ev.data, self._clock))
                return out
        merged()
        return out


def _wait_ms(d: Dispatched, block_ms: int, clock: Callable[[], float]) -> int:
    """How long the next read may block: ``block_ms``, less near the deadline; raises past it."""
    if d.request.deadline_unix is None:
        return block_ms
    left_ms = int((d.request.deadline_unix - clock()) * 1000)
    if left_ms <= 0:
        raise DeadlineExceeded(f"request {d.request.request_id} did not finish before its deadline")
    return max(1, min(block_ms, left_ms))


def _report(d: Dispatched, end: Final | str | None) -> bool:
    """Tell the request's observer how its stream ended: a Final, a failure code, or abandoned (None)."""
    if d.observer is not None:
        if isinstance(end, Final):
            d.observer.finished(d, end)
        elif end is None:
            d.observer.abandoned(d)
        else:
            d.observer.failed_with(d, end)
    return True


def _final(d: Dispatched, ev: Mapping[str, Any], clock: Callable[[], float]) -> Final:
    """The caller's ``Final`` from the final event: the worker put its queue wait and attempt in it."""
    received = d.request.received_unix or d.enqueued_unix
    return Final(
        request_id=d.request.request_id,
        text=str(ev.get("text", "")),
        finish_reason=str(ev.get("finish_reason", "stop")),
        prompt_tokens=int(ev.get("prompt_tokens", 0)),
        completion_tokens=int(ev.get("completion_tokens", 0)),
        model=d.model,
        engine=d.engine,
        queue_wait_s=float(ev.get("queue_wait_s", 0.0)),
        e2e_s=max(0.0, clock() - received),
        predicted_tokens=d.prediction.p50,
        predicted_tokens_p90=d.prediction.p90,
        attempts=int(ev.get("attempt") or ev.get("a") or 0),
        dispatch_ms=d.dispatch_ms,
        timings=d.timings,
        browned_out_from=d.browned_out_from,
        tool_calls=tool_calls_of(ev.get("tool_calls")),
        cached_prompt_tokens=int(ev.get("cached_tokens", 0)),
    )


async def _cancel_unless_reattached(store: QueueStore, engine: str, rid: str, detached: float) -> None:
    try:
        if await store.reattached_since(engine, rid, detached):
            return
    except REDIS_DOWN as e:
        log.warning("could not check request %s for a re-attached retry: %r", rid, e)
        return  # Redis is away: so is any way to cancel; the request's lease and expiry still bound it
    await _cancel_quietly(store, engine, rid)


async def _cancel_quietly(store: QueueStore, engine: str, rid: str) -> None:
    # Runs while the caller's task is being cancelled: shield the one Redis call so it completes.
    try:
        state = await asyncio.shield(store.cancel(engine, rid, reason="caller went away"))
        log.info("cancelled request %s (was %s)", rid, state)
    except _CANCEL_FAILED as e:
        log.warning("could not cancel request %s: %r", rid, e)
