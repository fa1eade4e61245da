"""Streaming one request's output back to its caller from the request's Redis Stream.

NOTE(stream): the stream, not an in-process channel, carries the output, so any front-door replica can
serve it and a reconnecting reader misses nothing. A request that is re-run after its worker died emits
deltas with a higher ``attempt``; earlier attempts' late deltas are dropped here, and the caller, seeing a
higher attempt, discards text it already has. If the caller goes away or its deadline passes, the request
is cancelled so that the engine stops spending tokens on it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from redis.asyncio import Redis

from services.common.keys import RequestField
from services.common.queue import QueueStore
from services.dispatcher.errors import (
    REDIS_DOWN,
    DeadlineExceeded,
    DispatchError,
    RequestFailed,
    guarded,
)
from services.dispatcher.handoff import Delta, Dispatched, Final, StreamItem

log = logging.getLogger(__name__)
# What may stop a best-effort cancel: the caller's own cancellation, or Redis being away.
_CANCEL_FAILED: tuple[type[BaseException], ...] = (asyncio.CancelledError, *REDIS_DOWN)


def _f(fields: Mapping[str, object], name: str) -> float | None:
    try:
        return float(str(fields[name]))
    except (KeyError, ValueError):
        return None


async def stream_output(
    store: QueueStore,
    redis: Redis,
    d: Dispatched,
    block_ms: int = 1000,
    clock: Callable[[], float] = time.time,
) -> AsyncIterator[StreamItem]:
    """Yield deltas, then exactly one ``Final``; raise ``RequestFailed`` on an error event.

    Raises ``DeadlineExceeded`` once the request's deadline passes (the request is cancelled first).
    """
    rid, engine = d.request.request_id, d.engine
    after, best_attempt, finished, reported = "0", 0, False, False
    try:
        while True:
            events = await guarded(store.read_events(engine, rid, after, _wait_ms(d, block_ms, clock)))
            _stop_if_cancelled()
            if not events:
                # Cheap liveness probe (never the whole hash: it holds the prompt).
                if not await guarded(redis.exists(store.keys.request(engine, rid))):
                    finished = True
                    raise RequestFailed("UNAVAILABLE", f"request {rid} expired before it finished")
                continue
            for ev in events:
                after = ev.stream_id
                kind, attempt = ev.data.get("t"), int(ev.data.get("a", 0))
                if kind == "delta":
                    if attempt < best_attempt:
                        continue  # a late delta from a worker whose lease was lost
                    best_attempt = attempt
                    yield Delta(str(ev.data.get("text", "")), attempt)
                elif kind == "error":
                    finished = True
                    raise RequestFailed(str(ev.data.get("code", "INTERNAL")), str(ev.data.get("message", "")))
                elif kind == "final":
                    finished = True
                    final = await _final(store, redis, d, ev.data, clock)
                    await _credit_quietly(store, d.request.program_id, final.completion_tokens)
                    reported = _report(d, final)
                    yield final
                    return
    except Exception as e:
        reported = _report(d, e.code if isinstance(e, DispatchError) else "INTERNAL")
        raise
    finally:
        if not reported:
            _report(d, None)  # the caller went away (or was cancelled) before the end
        if not finished:
            await _cancel_quietly(store, engine, rid)


def _stop_if_cancelled() -> None:
    """Re-raise a cancellation the blocking read swallowed.

    redis-py loses a cancel that lands as its blocking read times out (the read returns empty instead:
    3 to 5 of 300 cancels under CPU load here), and a reader that missed its cancel would block on for a
    caller who is gone, its request never cancelled. The task still counts the cancel request.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def _credit_quietly(store: QueueStore, program_id: str, tokens: int) -> None:
    """Attained-service bookkeeping must never cost the caller its answer."""
    try:
        await store.credit_program(program_id, tokens)
    except REDIS_DOWN as e:
        log.warning("could not credit %d tokens to program %s: %s", tokens, program_id, e)


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


async def _final(
    store: QueueStore, redis: Redis, d: Dispatched, ev: dict[str, Any], clock: Callable[[], float]
) -> Final:
    f = RequestField
    names = (f.T_ENQ, f.T_FIRST_CLAIM, f.ATTEMPT)
    raw = await guarded(redis.hmget(store.keys.request(d.engine, d.request.request_id), list(names)))
    fields = {n: v for n, v in zip(names, raw, strict=True) if v is not None}
    t_enq, t_claim = _f(fields, f.T_ENQ), _f(fields, f.T_FIRST_CLAIM)
    queue_wait = max(0.0, t_claim - t_enq) if t_enq is not None and t_claim is not None else 0.0
    attempts = int(_f(fields, f.ATTEMPT) or ev.get("a") or 0)
    received = d.request.received_unix or d.enqueued_unix
    return Final(
        request_id=d.request.request_id,
        text=str(ev.get("text", "")),
        finish_reason=str(ev.get("finish_reason", "stop")),
        prompt_tokens=int(ev.get("prompt_tokens", 0)),
        completion_tokens=int(ev.get("completion_tokens", 0)),
        model=d.model,
        engine=d.engine,
        queue_wait_s=queue_wait,
        e2e_s=max(0.0, clock() - received),
        predicted_tokens=d.prediction.p50,
        predicted_tokens_p90=d.prediction.p90,
        attempts=attempts,
        dispatch_ms=d.dispatch_ms,
        timings=d.timings,
    )


async def _cancel_quietly(store: QueueStore, engine: str, rid: str) -> None:
    # Runs while the caller's task is being cancelled: shield the one Redis call so it completes.
    try:
        state = await asyncio.shield(store.cancel(engine, rid, reason="caller went away"))
        log.info("cancelled request %s (was %s)", rid, state)
    except _CANCEL_FAILED as e:
        log.warning("could not cancel request %s: %r", rid, e)
