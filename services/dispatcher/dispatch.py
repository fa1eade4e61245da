"""Dispatch of one stage request: program lookup, engine choice, prediction, priority, atomic enqueue.

NOTE(dispatch): the order of steps is chosen so that a refused request leaves nothing behind. Everything
that can fail cheaply (input checks, the program lookup, the engine snapshot, the router and predictor
calls, a duplicate-id probe) runs before the first write. The two writes are the program assignment
(ASSIGN) and the engine step (ENQUEUE: request hash, in-flight tokens, queue entry, all in one script).
An assignment without a queued request is harmless (a retried stage reuses it; its TTL collects it), and
the one case where ENQUEUE still refuses after a fresh assignment (a duplicate id racing us) removes the
assignment it just made.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.common.queue import QueueStore
from services.common.types import DispatchTimings, EngineSnapshot, OutcomeRow, Prediction, StageRequest
from services.dispatcher.clients import ConfidenceSource, LengthSource
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.errors import (
    DispatchError,
    DuplicateRequest,
    InvalidRequest,
    ModelNotFound,
    NoLiveEngine,
    StageConflict,
    StoreUnavailable,
)
from services.dispatcher.metrics import DispatcherMetrics
from services.dispatcher.policy import POLICIES, Selection, engine_load_ms
from services.dispatcher.snapshot import read_engines
from services.dispatcher.validate import Limits, check_id, validate_request

if TYPE_CHECKING:
    from services.dispatcher.stream import Final

log = logging.getLogger(__name__)
T = TypeVar("T")

# KEYS: program; ARGV: request_id. Undo a fresh assignment only if it is still ours.
_UNASSIGN = """
if redis.call('HGET', KEYS[1], 'request_id') == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
OUTCOMES_MAXLEN = 1_000_000


class RequestObserver(Protocol):
    """Told exactly once how a dispatched request's output stream ended (metrics)."""

    def finished(self, d: Dispatched, final: Final) -> None: ...

    def failed_with(self, d: Dispatched, code: str) -> None: ...

    def abandoned(self, d: Dispatched) -> None: ...


@dataclass(frozen=True, slots=True)
class Dispatched:
    """A request that is now waiting in an engine's queue."""

    request: StageRequest
    engine: str
    model: str
    prediction: Prediction
    score: float
    enqueued_unix: float
    dispatch_ms: float  # router + predictor + policy + Redis, as the caller's Completion reports it
    degraded: tuple[str, ...]  # dependencies that failed and were replaced by a fallback
    branch: str = "new"  # new | pinned | reuse | reuse-race
    observer: RequestObserver | None = None  # told how the request's stream ends
    timings: DispatchTimings = DispatchTimings()  # the split of dispatch_ms


@dataclass(frozen=True, slots=True)
class ProgramEnd:
    found: bool
    cancelled_requests: int


@dataclass(slots=True)
class _Timings:
    router_ms: float = 0.0
    predictor_ms: float = 0.0
    policy_ms: float = 0.0
    redis_ms: float = 0.0

    def frozen(self) -> DispatchTimings:
        return DispatchTimings(self.router_ms, self.predictor_ms, self.policy_ms, self.redis_ms)


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


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
    ) -> None:
        self.store = store
        # Without one from __main__ (tests), metrics go to a private registry nobody scrapes.
        self.metrics = metrics or DispatcherMetrics(CollectorRegistry())
        self._r = redis
        self._keys = store.keys
        self._router = router
        self._predictor = predictor
        self.settings = settings
        self._policy = POLICIES[settings.policy]
        self._clock = clock
        self._limits = Limits(settings.max_tokens_limit, settings.max_prompt_chars)
        self._unassign = redis.register_script(_UNASSIGN)

    @property
    def redis(self) -> Redis:
        return self._r

    async def _redis(self, t: _Timings, call: Awaitable[T]) -> T:
        t0 = time.perf_counter()
        try:
            return await call
        except (RedisConnectionError, RedisTimeoutError, OSError) as e:
            raise StoreUnavailable(f"redis is unreachable: {e}") from e
        finally:
            t.redis_ms += _ms_since(t0)

    async def _program(self, t: _Timings, program_id: str) -> dict[str, str]:
        raw = await self._redis(t, self._r.hgetall(self._keys.program(program_id)))
        return {_s(a): _s(b) for a, b in raw.items()}

    async def engines(self) -> list[EngineSnapshot]:
        """Every registered engine as the policy sees it."""
        return await self._redis(
            _Timings(), read_engines(self._r, self._keys, self._clock(), self.settings.engine_dead_after_s)
        )

    async def dispatch(self, req: StageRequest) -> Dispatched:
        """Validate, choose an engine, predict, and enqueue; raises a ``DispatchError`` on refusal."""
        try:
            return await self._dispatch(req)
        except DispatchError as e:
            self.metrics.refused(e.code)
            raise
        except Exception:  # the server answers INTERNAL
            self.metrics.refused("INTERNAL")
            raise

    async def _dispatch(self, req: StageRequest) -> Dispatched:
        started = time.perf_counter()
        validate_request(req, self._limits)
        t = _Timings()
        k = self._keys
        program = await self._program(t, req.program_id)
        engines = await self._redis(
            t, read_engines(self._r, k, self._clock(), self.settings.engine_dead_after_s)
        )
        degraded: list[str] = []
        if req.model_pin is not None and req.model_pin not in {e.model for e in engines}:
            raise ModelNotFound(f"no registered engine serves model {req.model_pin!r}")
        selection: Selection | None = None
        confidences: Mapping[str, float] = {}
        if program:
            engine, model = self._reuse(req, program, engines)
            branch = "reuse"
        else:
            selection, confidences = await self._choose(req, engines, t, degraded)
            engine, model = selection.engine_id, selection.model
            branch = "pinned" if req.model_pin is not None else "new"
        # A retried request usually finds its first copy here, before anything is written; ENQUEUE stays
        # the authority for the rare retry that races its original.
        if await self._redis(t, self._r.exists(k.request(engine, req.request_id))):
            raise DuplicateRequest(f"request {req.request_id} already exists")
        pred = await self._predict(req, model, t, degraded)
        status, assigned, assigned_model = await self._redis(
            t,
            self.store.assign(
                req.program_id,
                engine,
                model,
                req.workflow,
                req.stage,
                req.request_id,
                self.settings.program_ttl_s,
                confidences,
            ),
        )
        if status == "backwards":
            raise StageConflict(f"stage {req.stage} is behind the program's last stage")
        if assigned != engine:
            # Another replica assigned this program first: join its engine (affinity), re-predict if the
            # model differs because the prediction is model-specific.
            log.info("program %s was assigned to %s concurrently; following it", req.program_id, assigned)
            if assigned_model != model:
                pred = await self._predict(req, assigned_model, t, degraded)
            engine, model, branch = assigned, assigned_model, "reuse-race"
        t_enq = self._clock()
        t0 = time.perf_counter()
        attained = int(program.get("attained", "0") or 0)  # 0 on a first stage: nothing finished yet
        fed = attained if self._policy.priority_input == "attained" else pred.p50
        score = self._policy.priority(fed, t_enq, self.settings.aging_rate, self.settings.priority_cap_tokens)
        t.policy_ms += _ms_since(t0)
        decision = self._record(branch, engine, model, selection, engines, pred, score, t_enq, degraded, t)
        decision["dispatch_ms_before_enqueue"] = _ms_since(started)
        ok = await self._redis(t, self.store.enqueue(engine, req, pred, score, t_enq, decision))
        if not ok:
            if status == "new":
                await self._redis(t, self._unassign(keys=[k.program(req.program_id)], args=[req.request_id]))
            raise DuplicateRequest(f"request {req.request_id} already exists")
        d = Dispatched(
            req,
            engine,
            model,
            pred,
            score,
            t_enq,
            _ms_since(started),
            tuple(degraded),
            branch,
            self.metrics,
            t.frozen(),
        )
        self.metrics.accepted(d, branch, dict(confidences))
        return d

    async def _choose(
        self, req: StageRequest, engines: Sequence[EngineSnapshot], t: _Timings, degraded: list[str]
    ) -> tuple[Selection, Mapping[str, float]]:
        """First stage: ask the router (unless pinned) and run the selection policy over live engines."""
        pool = [e for e in engines if req.model_pin is None or e.model == req.model_pin]
        if not any(e.alive for e in pool):
            raise NoLiveEngine("no live engine" + (f" serves {req.model_pin!r}" if req.model_pin else ""))
        # A pinned model needs no confidences: the policy then simply picks its least-loaded engine.
        confidences = {} if req.model_pin else await self._confidences(req, pool, t, degraded)
        t0 = time.perf_counter()
        s = self.settings
        selection = self._policy.select(pool, confidences, s.tau, s.delta_s)
        t.policy_ms += _ms_since(t0)
        return selection, confidences

    def _reuse(
        self, req: StageRequest, program: Mapping[str, str], engines: Sequence[EngineSnapshot]
    ) -> tuple[str, str]:
        engine, model = program.get("engine", ""), program.get("model", "")
        if req.model_pin is not None and req.model_pin != model:
            raise StageConflict(
                f"program {req.program_id} runs on {model!r}, not the pinned {req.model_pin!r}"
            )
        if req.stage < int(program.get("stage", "0") or 0):
            raise StageConflict(
                f"stage {req.stage} is behind the program's last stage {program.get('stage')}"
            )
        snap = next((e for e in engines if e.engine_id == engine), None)
        if snap is None or not snap.alive:
            # Affinity is the rule (paper §2.4): the workflow's context lives on that engine's model.
            raise NoLiveEngine(f"engine {engine!r} of program {req.program_id} is not alive")
        return engine, model

    async def _confidences(
        self, req: StageRequest, pool: Sequence[EngineSnapshot], t: _Timings, degraded: list[str]
    ) -> Mapping[str, float]:
        models = sorted({e.model for e in pool if e.alive})
        t0, ok = time.perf_counter(), False
        try:
            scores = await self._router.score(req.user_text(), req.workflow, models)
            ok = True
            return scores
        except Exception as e:  # any router failure degrades; availability beats precision
            log.warning("router failed (%s); dispatching %s to the fastest engine", e, req.request_id)
            degraded.append("router")
            return {}
        finally:
            t.router_ms += _ms_since(t0)
            self.metrics.upstream("router", time.perf_counter() - t0, ok)

    async def _predict(self, req: StageRequest, model: str, t: _Timings, degraded: list[str]) -> Prediction:
        t0, ok = time.perf_counter(), False
        try:
            pred = await self._predictor.predict(req, model)
            ok = True
            return pred
        except Exception as e:  # any predictor failure degrades to the request's own bound
            log.warning("predictor failed (%s); using max_tokens for %s", e, req.request_id)
            if "predictor" not in degraded:
                degraded.append("predictor")
            y = req.sampling.max_tokens
            return Prediction(p50=y, p90=y)
        finally:
            t.predictor_ms += _ms_since(t0)
            self.metrics.upstream("predictor", time.perf_counter() - t0, ok)

    def _record(
        self,
        branch: str,
        engine: str,
        model: str,
        selection: Selection | None,
        engines: Sequence[EngineSnapshot],
        pred: Prediction,
        score: float,
        t_enq: float,
        degraded: Sequence[str],
        t: _Timings,
    ) -> dict[str, Any]:
        """The decision record stored with the request: what ``chimera explain`` shows."""
        s = self.settings
        return {
            "policy": self._policy.name,
            "branch": branch,
            "engine": engine,
            "model": model,
            "selection": selection.to_record() if selection else None,
            "loads_ms": {e.engine_id: engine_load_ms(e) for e in engines},
            "alive": {e.engine_id: e.alive for e in engines},
            "tau": s.tau,
            "delta_s": s.delta_s,
            "y": pred.p50,
            "y90": pred.p90,
            "score": score,
            "aging_rate": s.aging_rate,
            "priority_cap_tokens": s.priority_cap_tokens,
            "t_enq": t_enq,
            "degraded": list(degraded),
            "timings_ms": {
                "router": t.router_ms,
                "predictor": t.predictor_ms,
                "policy": t.policy_ms,
                "redis": t.redis_ms,
            },
        }

    async def end_program(self, program_id: str, outcome: float | None) -> ProgramEnd:
        """Cancel the program's outstanding stage, keep its outcome as a label, forget the assignment."""
        check_id("program_id", program_id)
        if outcome is not None and not 0.0 <= outcome <= 1.0:
            raise InvalidRequest(f"outcome must be in [0, 1], got {outcome}")
        t, k = _Timings(), self._keys
        program = await self._program(t, program_id)
        if not program:
            return ProgramEnd(found=False, cancelled_requests=0)
        engine, rid = program.get("engine", ""), program.get("request_id", "")
        cancelled = 0
        if engine and rid:
            state = await self._redis(t, self.store.cancel(engine, rid, reason="program ended"))
            cancelled = int(state in ("queued", "running"))
        if outcome is not None:
            row = OutcomeRow(
                program_id, program.get("workflow", ""), program.get("model", ""), engine, outcome
            )
            await self._redis(
                t,
                self._r.xadd(k.outcomes(), {"row": row.to_json()}, maxlen=OUTCOMES_MAXLEN, approximate=True),
            )
        await self._redis(t, self._r.delete(k.program(program_id)))
        self.metrics.program_ended(program_id, program, outcome)
        return ProgramEnd(found=True, cancelled_requests=cancelled)
