"""The engine queues in Redis: the one module both the dispatcher and the workers use to change them.

Every method is one Lua script (see ``queue_scripts``) or a single command, so several dispatcher replicas
and workers can run at once without double counting. Output events are JSON objects in field ``ev`` of the
request's stream: ``{"t": "delta", "a": attempt, "text": ...}``, then exactly one
``{"t": "final", ...}`` or ``{"t": "error", "code": ..., "message": ...}``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any, NamedTuple, cast

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.typing import EncodableT, KeyT, StreamIdT

from services.common import pause_scripts as pause_lua
from services.common import program_scripts as program_lua
from services.common import queue_scripts as lua
from services.common.chat import ToolCallPiece
from services.common.keys import Keys, RequestField
from services.common.pipelined_scripts import evalsha, run_scripted
from services.common.queue_records import (
    READ_BATCH,
    EngineFull,
    OutputEvent,
    QueuedRequest,
    RenewResult,
    Retention,
    cancelled_event,
    event_json,
    give_back_args,
    give_back_keys,
    paused_tokens,
)
from services.common.redis_client import is_cluster
from services.common.types import ClaimedRequest, Prediction, StageRequest, StageResult, TraceRow

# Deltas per PUBLISH call (publish_deltas).
_PUBLISH_ITEMS = 64


class DeltaItem(NamedTuple):
    """One delta to publish. ``end`` is where it ends in the attempt's output so far (characters of its
    text and of its tool calls' names and arguments): PUBLISH drops a delta that is already in by it."""

    request_id: str
    attempt: int
    text: str
    end: int
    tool_calls: tuple[ToolCallPiece, ...] = ()


def delta_event(attempt: int, text: str, tool_calls: Sequence[ToolCallPiece] = ()) -> str:
    if tool_calls:
        return event_json(t="delta", a=attempt, text=text, tc=[p.wire() for p in tool_calls])
    return event_json(t="delta", a=attempt, text=text)


class QueueStore:
    def __init__(self, redis: Redis, keys: Keys, retention: Retention | None = None) -> None:
        """``redis`` decodes responses (``decode_responses=True``), as every client in Chimera does."""
        self._r = redis
        self._k = keys
        self.retention = retention or Retention()
        self._enqueue = redis.register_script(lua.ENQUEUE)
        self._claim = redis.register_script(lua.CLAIM)
        self._renew = redis.register_script(lua.RENEW)
        self._complete = redis.register_script(lua.COMPLETE)
        self._cancel = redis.register_script(lua.CANCEL)
        self._reap = redis.register_script(lua.REAP)
        self._return_claims = redis.register_script(lua.RETURN_CLAIMS)
        self._assign = redis.register_script(program_lua.ASSIGN)
        self._credit = redis.register_script(program_lua.CREDIT)
        self._publish = redis.register_script(lua.PUBLISH)
        self._reattach = redis.register_script(lua.REATTACH)
        self._unassign = redis.register_script(program_lua.UNASSIGN)
        self._resume = redis.register_script(pause_lua.RESUME)
        self._expire_pauses = redis.register_script(pause_lua.EXPIRE_PAUSES)
        self._cluster = is_cluster(redis)  # a program and its engine's keys share no slot there

    @property
    def keys(self) -> Keys:
        return self._k

    @property
    def redis(self) -> Redis:
        return self._r

    def _req_prefix(self, engine: str) -> str:
        return self._k.request(engine, "")

    async def assign(
        self,
        program_id: str,
        engine: str,
        model: str,
        workflow: str,
        stage: int,
        request_id: str,
        ttl_s: int,
        confidences: Mapping[str, float],
        moved_from: str = "",
    ) -> tuple[bool, tuple[str, str, str]]:
        """In one round trip: whether ``request_id`` already exists on ``engine``, and ASSIGN's
        (status, engine, model). ``moved_from``: the program's dead engine, which ``engine`` replaces (if
        the program still names it)."""
        confidences_json = json.dumps(dict(confidences))
        args: list[EncodableT] = [
            engine,
            model,
            workflow,
            stage,
            request_id,
            ttl_s,
            confidences_json,
            time.time(),
            moved_from,
        ]

        def build(pipe: Pipeline) -> None:
            pipe.exists(self._k.request(engine, request_id))
            evalsha(pipe, self._assign, [self._k.program(program_id)], args)

        duplicate, assignment = await run_scripted(self._r, [self._assign], build)
        status, assigned, assigned_model = (str(x) for x in assignment)
        return bool(duplicate), (status, assigned, assigned_model)

    async def unassign(self, program_id: str, request_id: str) -> bool:
        """Undo a fresh assignment whose request was refused, if the program still names that request."""
        return bool(await self._unassign(keys=[self._k.program(program_id)], args=[request_id]))

    async def credit_program(self, program_id: str, tokens: int) -> int:
        """Add a finished stage's output tokens to its program's attained service (0: program gone)."""
        return int(await self._credit(keys=[self._k.program(program_id)], args=[max(0, tokens)]))

    async def enqueue(
        self,
        engine: str,
        req: StageRequest,
        pred: Prediction,
        score: float,
        enqueued_unix: float,
        decision: Mapping[str, Any],
        max_load_tokens: int = 0,
        weight: int = 1,
    ) -> bool:
        """Atomically record the request, its in-flight tokens and its queue entry. False if it exists;
        ``EngineFull`` (nothing written) if the engine already holds more than ``max_load_tokens`` in-flight
        predicted tokens (0: no bound). ``weight``: its tenant's fair-share weight (a tenant-scoped id)."""
        k = self._k
        ok = await self._enqueue(
            keys=[
                k.request(engine, req.request_id),
                k.inflight(engine),
                k.engine_info(engine),
                k.queue(engine),
                k.wake(engine),
            ],
            args=[
                req.request_id,
                req.to_json(),
                pred.p50,
                pred.p90,
                repr(score),
                repr(enqueued_unix),
                self.retention.queue_ttl_s,
                json.dumps(dict(decision), separators=(",", ":")),
                req.program_id,
                max_load_tokens,
                weight,
            ],
        )
        if int(ok) < 0:
            raise EngineFull(engine)
        return bool(ok)

    async def claim(self, engine: str, worker_id: str, n: int, lease_s: float) -> list[ClaimedRequest]:
        """Pop up to ``n`` requests in schedule order and hold a lease on each."""
        if n <= 0:
            return []
        now = time.time()
        k = self._k
        rows = await self._claim(
            keys=[
                k.queue(engine),
                k.claims(engine),
                k.inflight(engine),
                k.engine_info(engine),
                k.wake(engine),
            ],
            args=[
                n,
                int(lease_s * 1000),
                worker_id,
                repr(now),
                self._req_prefix(engine),
                self.retention.max_attempts,
            ],
        )
        out = []
        for rid, payload, y, y90, t_enq, attempt, t_first in rows:
            out.append(
                ClaimedRequest(
                    engine=engine,
                    request=StageRequest.from_json(payload),
                    predicted=int(y),
                    predicted_p90=int(y90),
                    attempt=int(attempt),
                    enqueued_unix=float(t_enq),
                    claimed_unix=now,
                    first_claimed_unix=float(t_first or now),
                )
            )
            assert out[-1].request.request_id == rid
        return out

    async def wait_for_work(self, engine: str, timeout_s: float) -> None:
        """Block until a dispatch rings the engine's doorbell, or the timeout passes."""
        await self._r.blpop([self._k.wake(engine)], timeout=timeout_s)

    async def renew(self, engine: str, held: Mapping[str, int], lease_s: float) -> RenewResult:
        """Extend leases on ``held`` (request id -> attempt)."""
        if not held:
            return RenewResult(frozenset(), frozenset())
        args: list[Any] = [int(lease_s * 1000), self._req_prefix(engine)]
        for rid, attempt in held.items():
            args += [rid, attempt]
        lost, cancelled = await self._renew(keys=[self._k.claims(engine)], args=args)
        return RenewResult(frozenset(lost), frozenset(cancelled))

    async def publish_delta(self, engine: str, request_id: str, attempt: int, text: str, end: int) -> bool:
        """One delta (see ``publish_deltas``); False if the attempt no longer holds the request or the
        delta is already in."""
        return (await self.publish_deltas(engine, [DeltaItem(request_id, attempt, text, end)]))[0]

    async def publish_deltas(self, engine: str, items: Sequence[DeltaItem]) -> list[bool]:
        """Append one delta each to requests' output streams, (request id, attempt, text, the attempt's
        text length with it), and notify, in one round trip. A stream lives ``queue_ttl_s`` past its last
        event. Each is written only while its attempt holds the running request, and once."""
        res = await run_scripted(self._r, [self._publish], lambda p: self._queue_publish(p, engine, items))
        return [bool(x) for r in res for x in r]

    def _queue_publish(self, pipe: Pipeline, engine: str, items: Sequence[DeltaItem]) -> None:
        # One script call per _PUBLISH_ITEMS deltas (queue_scripts.PUBLISH): a bounded call keeps any one
        # script from holding Redis long when an engine runs hundreds of sequences.
        r, k = self.retention, self._k
        for i in range(0, len(items), _PUBLISH_ITEMS):
            keys: list[KeyT] = [k.notify(engine)]
            args: list[EncodableT] = [r.stream_maxlen, r.queue_ttl_s, r.notify_maxlen]
            for item in items[i : i + _PUBLISH_ITEMS]:
                d = DeltaItem(*item)
                keys += (k.output(engine, d.request_id), k.request(engine, d.request_id))
                note_head = f"[{json.dumps(d.request_id)},"
                event = delta_event(d.attempt, d.text, d.tool_calls)
                args += (d.request_id, event, d.attempt, d.end, note_head)
            evalsha(pipe, self._publish, keys, args)

    async def complete(
        self,
        claimed: ClaimedRequest,
        result: StageResult,
        trace: TraceRow | None,
        extra: Mapping[str, Any] | None = None,
        deltas: Sequence[DeltaItem] = (),
    ) -> bool:
        """Finish a request with its result. False if this attempt no longer held it (nothing written).

        ``deltas``: its last text not yet published, written ahead of the final event in the same round
        trip (``publish_deltas``' items)."""
        state = "cancelled" if result.finish_reason == "cancelled" else "done"
        event = event_json(
            t="final",
            a=claimed.attempt,
            text=result.text,
            finish_reason=result.finish_reason,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            **({"cached_tokens": result.cached_tokens} if result.cached_tokens else {}),
            **({"tool_calls": [asdict(c) for c in result.tool_calls]} if result.tool_calls else {}),
            **(extra or {}),
        )
        # The program's attained service (what MLFQ orders by): once per completed stage, by the one attempt
        # that completed it; inside COMPLETE on a single Redis, after it on a cluster (another slot).
        tokens = max(0, result.completion_tokens)
        pause = paused_tokens(claimed, result)
        credit = None if self._cluster else tokens
        done = await self._finish(claimed, state, event, trace, credit, deltas, pause)
        if done and self._cluster:
            await self.credit_program(claimed.request.program_id, tokens)
        return done

    async def fail(self, claimed: ClaimedRequest, code: str, message: str) -> bool:
        """Finish a request with an error (a gRPC status code name). False if the lease was lost."""
        return await self._finish(claimed, "failed", event_json(t="error", code=code, message=message), None)

    async def _finish(
        self,
        c: ClaimedRequest,
        state: str,
        event: str,
        trace: TraceRow | None,
        credit: int | None = None,
        deltas: Sequence[DeltaItem] = (),
        pause: int = 0,
    ) -> bool:
        """COMPLETE, after ``deltas`` (PUBLISH) in one pipeline; ``credit``: output tokens to add to the
        program's attained service in the same step; ``pause``: predicted tokens its tool pause keeps in
        the engine's load (``pause_scripts``)."""
        k, rid, r = self._k, c.request.request_id, self.retention
        keys: list[KeyT] = [
            k.request(c.engine, rid),
            k.claims(c.engine),
            k.inflight(c.engine),
            k.engine_info(c.engine),
            k.output(c.engine, rid),
            k.traces(c.engine),
            k.notify(c.engine),
            k.paused(c.engine),
            k.pause_deadlines(c.engine),
        ]
        args: list[EncodableT] = [
            rid,
            c.attempt,
            state,
            event,
            trace.to_json() if trace else "",
            r.finished_ttl_s,
            r.stream_maxlen,
            r.traces_maxlen,
            repr(time.time()),
            r.notify_maxlen,
            c.request.program_id,
            pause,
            int(c.request.pause_ttl_s * 1000),
        ]
        if credit is not None:
            keys.append(k.program(c.request.program_id))
            args.append(credit)
        if not deltas:
            return bool(await self._complete(keys=keys, args=args))

        def build(pipe: Pipeline) -> None:
            self._queue_publish(pipe, c.engine, deltas)
            evalsha(pipe, self._complete, keys, args)

        return bool((await run_scripted(self._r, [self._publish, self._complete], build))[-1])

    async def reattach(self, engine: str, request_id: str, now: float) -> QueuedRequest | None:
        """The request as it was enqueued (None if it does not exist), marked as re-attached at ``now``."""
        row = await self._reattach(keys=[self._k.request(engine, request_id)], args=[repr(now)])
        if not row:
            return None
        program_id, y, y90, score, t_enq, state = row
        return QueuedRequest(
            str(program_id or ""),
            Prediction(int(y or 0), int(y90 or 0)),
            float(score or 0.0),
            float(t_enq or 0.0),
            str(state),
        )

    async def reattached_since(self, engine: str, request_id: str, t: float) -> bool:
        """Whether a retry re-attached to the request after ``t`` (unix s)."""
        at = await self._r.hget(self._k.request(engine, request_id), RequestField.REATTACHED)
        return at is not None and float(at) > t

    async def cancel(self, engine: str, request_id: str, reason: str = "cancelled") -> str:
        """Cancel a request wherever it is. Returns the state it was found in ('missing' if unknown)."""
        k = self._k
        st = await self._cancel(
            keys=[
                k.request(engine, request_id),
                k.queue(engine),
                k.inflight(engine),
                k.engine_info(engine),
                k.output(engine, request_id),
                k.notify(engine),
            ],
            args=[
                request_id,
                cancelled_event(reason),
                self.retention.finished_ttl_s,
                repr(time.time()),
                self.retention.notify_maxlen,
            ],
        )
        return str(st)

    async def resume(self, engine: str, program_id: str) -> int:
        """End the tool pause ``program_id`` holds on ``engine`` (its next stage is being dispatched, or it
        ended); the tokens taken back from the engine's load (0: it held none there)."""
        return int(await self._resume(keys=self._pause_keys(engine), args=[program_id]))

    def _pause_keys(self, engine: str) -> list[KeyT]:
        k = self._k
        return [k.paused(engine), k.pause_deadlines(engine), k.engine_info(engine)]

    async def reap(self, engine: str) -> list[str]:
        """Re-queue requests whose worker's lease expired, and end tool pauses past their deadline. Returns
        the re-queued ids."""
        await self._expire_pauses(keys=self._pause_keys(engine), args=[])
        args = give_back_args(self._k, self.retention, engine, "cancelled; its worker died", time.time())
        ids = await self._reap(keys=give_back_keys(self._k, engine), args=args)
        if ids:
            await self._r.rpush(self._k.wake(engine), 1)
        return list(ids)

    async def return_claims(self, engine: str, held: Sequence[tuple[str, int, bool]]) -> list[str]:
        """Hand back the claims of a live worker whose engine died, (request id, attempt, started) each, at
        once rather than after their leases: only those that had started are charged with the death.
        Returns the ids re-queued (the rest were failed as poison, cancelled, or no longer held)."""
        if not held:
            return []
        args = give_back_args(self._k, self.retention, engine, "cancelled; its engine died", time.time())
        for rid, attempt, started in held:
            args += [rid, attempt, 1 if started else 0]
        ids = await self._return_claims(keys=give_back_keys(self._k, engine), args=args)
        if ids:
            await self._r.rpush(self._k.wake(engine), 1)
        return list(ids)

    async def read_many(
        self, after: Mapping[tuple[str, str], str]
    ) -> dict[tuple[str, str], list[OutputEvent]]:
        """New events of many requests, (engine, request id) -> events after the given stream id, in one
        round trip: one XREAD per engine (an engine's streams share its hash tag), pipelined."""
        by_engine: dict[str, dict[KeyT, StreamIdT]] = {}
        for (engine, rid), sid in after.items():
            by_engine.setdefault(engine, {})[self._k.output(engine, rid)] = sid
        pipe = self._r.pipeline(transaction=False)
        for streams in by_engine.values():
            pipe.xread(streams, count=READ_BATCH)
        out: dict[tuple[str, str], list[OutputEvent]] = {}
        names = {self._k.output(e, rid): (e, rid) for e, rid in after}
        for res in await pipe.execute():
            for stream, entries in res or []:
                out[names[stream]] = [OutputEvent(sid, json.loads(f["ev"])) for sid, f in entries]
        return out

    async def request_fields(self, engine: str, request_id: str) -> dict[str, str]:
        return cast(dict[str, str], await self._r.hgetall(self._k.request(engine, request_id)))
