"""Dispatch of one stage request: program lookup, engine choice, prediction, priority, atomic enqueue.

NOTE(dispatch): the order of steps is chosen so that a refused request leaves nothing behind. Everything
that can fail cheaply (input checks, the program lookup, the engine snapshot, the router and predictor
calls, a duplicate-id probe) runs before the first write. The two writes are the program assignment
(ASSIGN) and the engine step (ENQUEUE: request hash, in-flight tokens, queue entry, all in one script).
An assignment without a queued request is harmless (a retried stage reuses it; its TTL collects it), and
the one case where ENQUEUE still refuses after a fresh assignment (a duplicate id racing us) removes the
assignment it just made.

The decisions themselves (affinity, the policy's pick, the queue score) are the pure functions of
``services.policy.routing``, the same ones the simulator's ledger calls.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import NoReturn, TypeVar, cast

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from services.common.apikeys import ApiKeyStore
from services.common.keys import ProgramField
from services.common.queue import QueueStore
from services.common.queue_records import EngineFull
from services.common.snapshot import engine_ids, engines_from, queue_engine_reads, read_engines
from services.common.types import EngineSnapshot, StageRequest
from services.dispatcher import programs
from services.dispatcher.auth import Authenticator, keys_required
from services.dispatcher.capability import able_engines
from services.dispatcher.clients import ConfidenceSource, LengthSource
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.decision import Timings, decision_record, detour_record, ms_since
from services.dispatcher.door import OPEN_RETRY_S
from services.dispatcher.errors import (
    DispatchError,
    DuplicateRequest,
    InvalidRequest,
    ModelNotFound,
    NoLiveEngine,
    Overloaded,
    StageConflict,
    guarded,
)
from services.dispatcher.gate import Gate
from services.dispatcher.handoff import Dispatched, ProgramEnd, StreamItem
from services.dispatcher.hub import StreamHub
from services.dispatcher.intake import Intake, admit, check_intake, idle_ttl_s
from services.dispatcher.metrics import DispatcherMetrics
from services.dispatcher.pending import Claim, PendingLoad
from services.dispatcher.quotas import Quotas
from services.dispatcher.reattach import reattach
from services.dispatcher.routes import Routing
from services.dispatcher.stream import stream_output
from services.dispatcher.tenancy import check_unscoped, scope_intake, scoped
from services.dispatcher.upstream import Upstream
from services.dispatcher.validate import check_id, check_stage_skip, validate_request
from services.policy import contract
from services.policy.contract import JobSize
from services.policy.registry import POLICIES
from services.policy.routing import AffinityConflict, queue_score

log = logging.getLogger(__name__)
T = TypeVar("T")

_IDS_TTL_S = 1.0


def _duplicate(req: StageRequest) -> DuplicateRequest:
    return DuplicateRequest(f"request {req.request_id} already exists")


@contextlib.contextmanager
def _policy_errors() -> Iterator[None]:
    """The pure policy's refusals, as the front door's status-coded errors."""
    try:
        yield
    except contract.NoLiveEngine as e:
        raise NoLiveEngine(str(e)) from e
    except AffinityConflict as e:
        raise StageConflict(str(e)) from e


class Dispatcher:
    def __init__(
        self,
        store: QueueStore,
        redis: Redis,
        router: ConfidenceSource,
        predictor: LengthSource,
        settings: DispatcherSettings,
        clock: Callable[[], float] = time.time,
        metrics: DispatcherMetrics | None = None,
        hub: StreamHub | None = None,
    ) -> None:
        """``hub`` reads every output stream this process serves; without one (tests) it shares ``redis``."""
        self.store = store
        # Without one from __main__ (tests), metrics go to a private registry nobody scrapes.
        self.metrics = metrics or DispatcherMetrics(CollectorRegistry())
        self._r = redis
        self._keys = store.keys
        self._up = Upstream(router, predictor, self.metrics)
        self.settings = settings
        self._policy = POLICIES[settings.policy]
        self._knobs = settings.knobs()
        self._clock = clock
        self._limits = settings.limits()
        self.hub = hub or StreamHub(store, redis, settings.stream_block_ms)
        self._ids: list[str] = []
        self._ids_at = 0.0
        self._gate = Gate(settings.bounds(), self.metrics)
        self._routing = Routing(self._up, self._policy, self._knobs, self._gate)
        self._pending = PendingLoad()
        self._forgetting = programs.Forgetting(store)
        required = keys_required(settings.auth, settings.door_hosts())
        self.auth = Authenticator(ApiKeyStore(redis, store.keys) if required else None, settings.auth_cache_s)
        self.quotas = Quotas.of(redis, store.keys, settings)
        self._dispatching = 0
        b = self._gate.bounds
        self.metrics.limits(
            b.max_queue_s, b.brownout_margin, settings.max_open_requests, lambda: self.open_requests
        )

    @property
    def redis(self) -> Redis:
        return self._r

    async def _redis(self, t: Timings, call: Awaitable[T]) -> T:
        t0 = time.perf_counter()
        try:
            return await guarded(call)
        finally:
            t.redis_ms += ms_since(t0)

    async def _engine_ids(self, t: Timings, fresh: bool = False) -> list[str]:
        """The registered engines, re-read at most every ``_IDS_TTL_S``: an engine appears within a second."""
        now = time.monotonic()
        if fresh or not self._ids or now - self._ids_at > _IDS_TTL_S:
            self._ids = await self._redis(t, engine_ids(self._r, self._keys))
            self._ids_at = now
        return self._ids

    async def _state(
        self, t: Timings, program_id: str, fresh: bool = False
    ) -> tuple[dict[str, str], list[EngineSnapshot]]:
        """The program's row and every engine's snapshot, in one round trip."""
        ids = await self._engine_ids(t, fresh)
        pipe = self._r.pipeline(transaction=False)
        pipe.hgetall(self._keys.program(program_id))
        queue_engine_reads(pipe, self._keys, ids)
        res = await self._redis(t, pipe.execute())
        engines = engines_from(res[1:], ids, self._clock(), self.settings.engine_dead_after_s)
        self._gate.drain.observe(engines, time.monotonic())
        return cast(dict[str, str], res[0]), engines

    async def engines(self) -> list[EngineSnapshot]:
        """Every registered engine as the policy sees it."""
        return await self._redis(
            Timings(), read_engines(self._r, self._keys, self._clock(), self.settings.engine_dead_after_s)
        )

    async def submit(self, intake: Intake, tenant: str = "") -> Dispatched:
        """Both front doors' way in: scope the ids to the caller's tenant, resolve "the next stage", apply
        the defaults, dispatch.

        Raises a ``DispatchError`` on refusal; nothing is written then.
        """
        started, t = time.perf_counter(), Timings()

        async def run() -> Dispatched:
            check_intake(intake, self._limits)  # the program id becomes part of a key name
            own = scope_intake(intake, tenant)
            with self._pending.scope() as claim:
                program, engines = await self._state(t, own.program_id)
                req = admit(own, program, self.settings, self._limits, self._clock())
                engines = await self.quotas.permitted(req, engines)  # a tenant's allowed models only
                async with self.quotas.charge(req, new=not program) as bill:  # given back if refused
                    d = await self._dispatch(req, program, engines, t, started, claim)
                    if d.branch == "reattach":
                        await bill.give_back()  # the first call paid for this request
                    return d

        return await self._counted(run())

    async def dispatch(self, req: StageRequest) -> Dispatched:
        """Dispatch a request built elsewhere (tests, benchmarks); the doors use ``submit``."""
        started, t = time.perf_counter(), Timings()

        async def run() -> Dispatched:
            validate_request(req, self._limits)
            with self._pending.scope() as claim:
                program, engines = await self._state(t, req.program_id)
                check_stage_skip(req.stage, program, self._limits.max_stage_skip)
                return await self._dispatch(req, program, engines, t, started, claim)

        return await self._counted(run())

    async def _counted(self, call: Awaitable[Dispatched]) -> Dispatched:
        self._dispatching += 1
        try:
            return await call
        except DispatchError as e:
            self.metrics.refused(e.code)
            raise
        except Exception:  # the server answers INTERNAL
            self.metrics.refused("INTERNAL")
            raise
        finally:
            self._dispatching -= 1

    def stream(self, d: Dispatched) -> AsyncIterator[StreamItem]:
        """The dispatched request's output: deltas, then exactly one ``Final`` (see ``stream_output``)."""
        s = self.settings
        return stream_output(self.hub, self.store, d, s.stream_block_ms, s.stream_probe_s, s.detach_grace_s)

    async def close(self) -> None:
        """Stop the stream reader (the process is shutting down; no stream is served any more)."""
        await self.hub.stop()

    async def _dispatch(
        self,
        req: StageRequest,
        program: Mapping[str, str],
        engines: list[EngineSnapshot],
        t: Timings,
        started: float,
        claim: Claim,
    ) -> Dispatched:
        """Everything after validation and the state read, which ``submit`` and ``dispatch`` do."""
        degraded: list[str] = []
        if req.model_pin is not None and req.model_pin not in {e.model for e in engines}:
            # Perhaps an engine registered since the ids were cached: look once more before refusing.
            _, engines = await self._state(t, req.program_id, fresh=True)
            if req.model_pin not in {e.model for e in engines}:
                raise ModelNotFound(f"no registered engine serves model {req.model_pin!r}")
        engines = able_engines(req, engines)  # a later stage on an engine that cannot moves (capability.py)
        if not program and self.open_requests > self.settings.max_open_requests:
            # Only a new workflow: an admitted one's later stages always get in.
            raise Overloaded(f"this dispatcher holds {self.open_requests} open requests", OPEN_RETRY_S)
        with _policy_errors():
            r, engines = await self._routing.route(req, program, engines, claim, t, degraded)
        route, preds, confidences, max_load = r.route, r.preds, r.confidences, r.max_load
        engine, model, branch = route.engine_id, route.model, str(route.branch)
        pred, browned_out_from = preds[model], r.browned_out_from
        # A retried request usually finds its first copy here, before anything is queued; ENQUEUE stays the
        # authority for the rare retry that races its original past this check.
        duplicate, (status, assigned, assigned_model) = await self._redis(
            t,
            self.store.assign(
                req.program_id,
                engine,
                model,
                req.workflow,
                req.stage,
                req.request_id,
                idle_ttl_s(req.identity, self.settings),
                confidences,
                r.leaves,
            ),
        )
        if status == "backwards":
            raise StageConflict(f"stage {req.stage} is behind the program's last stage")
        if duplicate:
            return await self._reattach(t, status, program, req, engine, assigned_model, started)
        # status "duplicate" with no request: its first try never got queued, or Redis lost it; queue it now.
        if assigned != engine:
            # Another replica assigned this program first: join its engine (affinity), re-predict if the
            # model differs because the prediction is model-specific.
            log.info("program %s was assigned to %s concurrently; following it", req.program_id, assigned)
            if assigned_model != model:
                pred = (
                    preds.get(assigned_model)
                    or (await self._up.predictions(req, [assigned_model], t, degraded))[assigned_model]
                )
            engine, model, branch, browned_out_from = assigned, assigned_model, "reuse-race", ""
            max_load = 0  # it joins an admitted workflow
        if program.get(ProgramField.ENGINE):
            # Its tool pause ends where it held it (pause_scripts), before this stage's own ŷ is charged.
            await self._redis(t, self.store.resume(program[ProgramField.ENGINE], req.program_id))
        fair = await self._redis(t, self.quotas.fair_term(engine, req.request_id))  # tenant "": no read
        t_enq = self._clock()
        t0 = time.perf_counter()
        # attained is 0 on a first stage: nothing has finished yet.
        size = JobSize(predicted_total=pred.p50, attained=int(program.get(ProgramField.ATTAINED) or 0))
        score = queue_score(self._policy, size, t_enq, self._knobs, fair.tokens)
        t.policy_ms += ms_since(t0)
        decision = decision_record(
            self.settings,
            self._policy,
            branch,
            engine,
            model,
            route,
            engines,
            pred,
            size,
            score,
            t_enq,
            degraded,
            t,
        )
        decision["identity"] = req.identity
        decision.update(detour_record(engine, browned_out_from, r.moved_from, self._gate.bounds))
        if r.escalation is not None:
            decision["escalation"] = r.escalation.to_record()
        decision["dispatch_ms_before_enqueue"] = ms_since(started)
        self.hub.expect(engine, req.request_id)  # its stream then needs no backlog read (hub.py)
        enqueued = False
        try:
            enqueued = await self._redis(
                t, self.store.enqueue(engine, req, pred, score, t_enq, decision, max_load, fair.weight)
            )
        except EngineFull:
            # The engine filled past the bound between our read and our write (concurrent dispatches).
            full = next(e for e in engines if e.engine_id == engine)
            await self._undo_and_refuse(t, status, req, self._gate.filled(full))
        finally:
            if not enqueued:  # refused, failed, or a retry's first copy (which has a backlog): withdrawn
                self.hub.unexpect(engine, req.request_id)
        if not enqueued:  # a retry that raced its first copy past the check above
            return await self._reattach(t, status, program, req, engine, model, started)
        claim.enqueued()
        d = Dispatched(
            req,
            engine,
            model,
            pred,
            score,
            t_enq,
            ms_since(started),
            tuple(degraded),
            branch,
            self.metrics,
            t.frozen(),
            browned_out_from,
        )
        self.metrics.accepted(d, branch, dict(confidences))
        return d

    async def _reattach(
        self,
        t: Timings,
        status: str,
        program: Mapping[str, str],
        req: StageRequest,
        engine: str,
        model: str,
        started: float,
    ) -> Dispatched:
        """The request id exists on the engine. A retry (the program's current stage and request, ASSIGN's
        "duplicate") streams the request again; anything else reusing the id is refused."""
        d = None
        if status == "duplicate" and program.get(ProgramField.STAGE) == str(req.stage):
            d = await self._redis(t, reattach(self.store, req, engine, model, t, started, self._clock()))
        if d is None:
            await self._undo_and_refuse(t, status, req, _duplicate(req))
        self.metrics.reattached(engine)
        return d

    @property
    def open_requests(self) -> int:
        """Requests this process holds: being dispatched, or streaming back."""
        return self._dispatching + self.hub.open_streams

    async def _undo_and_refuse(
        self, t: Timings, status: str, req: StageRequest, error: DispatchError
    ) -> NoReturn:
        """Refuse a request whose ASSIGN already ran: undo the assignment if it made one, then raise."""
        if status == "new":
            await self._redis(t, self.store.unassign(req.program_id, req.request_id))
        raise error

    async def forget_program(self, program_id: str) -> None:
        """Drop a program whose stages have all finished or been cancelled (a one-stage HTTP request):
        ``end_program`` without its reads, as there is nothing left to cancel and no outcome to keep."""
        await self._forgetting.forget(program_id)
        self.metrics.program_ended(program_id, {}, None)

    async def end_program(self, program_id: str, outcome: float | None, tenant: str = "") -> ProgramEnd:
        """Cancel the program's outstanding stage, keep its outcome as a label, forget the assignment; all
        in ``tenant``'s namespace."""
        check_id("program_id", program_id, self._limits.max_id_chars)
        check_unscoped("program_id", program_id)
        program_id = scoped(tenant, program_id)
        if outcome is not None and not 0.0 <= outcome <= 1.0:
            raise InvalidRequest(f"outcome must be in [0, 1], got {outcome}")
        end, program = await programs.end_program(self.store, program_id, outcome)
        if end.found:
            self.metrics.program_ended(program_id, program, outcome)
        return end
