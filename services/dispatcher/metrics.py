"""The front door's Prometheus metrics: request outcomes, dispatch and dependency latency, queue wait and
age at dispatch, predicted vs realized tokens, router calibration, per-engine queue gauges, and the
background jobs' runs (``jobruns``, read from Redis per scrape).

NOTE(accounting): every request that ``dispatch`` accepts is counted once as dispatched and, when its
output stream ends, once as completed, failed or cancelled (``stream_output`` reports the end through the
``RequestObserver`` the ``Dispatched`` handle carries), so after a run
``dispatched == completed + failed + cancelled`` per engine and model. A request refused before it was
queued is no dispatch: it only counts in ``errors_total{phase="dispatch"}``.

NOTE(tokens): the predictor predicts the *remaining* output tokens of a workflow (this stage and later
ones), so a prediction is compared with what the program really produced from that stage on. Stage totals
accumulate per program in this process and are observed when the program ends (EndProgram, or the end of
a one-stage HTTP request); a program that never ends is dropped unobserved once ``max_open_programs``
newer ones are open.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis import Redis as SyncRedis
from redis.exceptions import RedisError

from services.common.jobruns import JobRunsCollector
from services.common.keys import Keys, ProgramField, RequestField
from services.common.metrics import (
    CONFIDENCE_BUCKETS,
    LATENCY_BUCKETS,
    RATIO_BUCKETS,
    TOKEN_BUCKETS,
    WAIT_BUCKETS,
    confidence_bucket,
    start_exporter,
)
from services.common.redis_client import connect_sync
from services.common.snapshot import parse_engine
from services.common.types import EngineSnapshot
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.handoff import Dispatched, Final
from services.policy.admission import work_s

log = logging.getLogger(__name__)
NS = "chimera_dispatcher"


@dataclass(slots=True)
class _Stage:
    model: str
    predicted: int
    realized: int = 0


@dataclass(slots=True)
class _Program:
    stages: list[_Stage] = field(default_factory=list)


class DispatcherMetrics:
    """Recorders for one dispatcher process; ``registry`` is what its ``/metrics`` serves."""

    def __init__(self, registry: CollectorRegistry, max_open_programs: int = 10_000) -> None:
        self.registry = registry
        self._open: OrderedDict[str, _Program] = OrderedDict()
        self._max_open = max_open_programs
        em = ["engine", "model"]
        r = registry
        self.dispatched = Counter(
            f"{NS}_requests_dispatched_total", "requests queued on an engine", em, registry=r
        )
        self.completed = Counter(f"{NS}_requests_completed_total", "requests that finished", em, registry=r)
        self.failed = Counter(
            f"{NS}_requests_failed_total", "queued requests that failed, by code", [*em, "code"], registry=r
        )
        self.cancelled = Counter(
            f"{NS}_requests_cancelled_total",
            "queued requests cancelled (caller gone, program ended)",
            em,
            registry=r,
        )
        self.errors = Counter(
            f"{NS}_errors_total",
            "refused (phase=dispatch) or failed (phase=stream) requests by gRPC status code",
            ["code", "phase"],
            registry=r,
        )
        self.dispatch_seconds = Histogram(
            f"{NS}_dispatch_seconds",
            "router + predictor + policy + Redis time of an accepted dispatch, by branch",
            ["branch"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_seconds = Histogram(
            f"{NS}_upstream_seconds",
            "router and predictor call latency as the dispatcher sees it",
            ["dependency", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_bound = Gauge(
            f"{NS}_queue_bound_seconds",
            "predicted seconds of work an engine may hold (0: unbounded)",
            registry=r,
        )
        self.brownout_margin = Gauge(
            f"{NS}_brownout_margin",
            "confidence a brownout target may have below the chosen model's",
            registry=r,
        )
        self.open_requests_limit = Gauge(
            f"{NS}_open_requests_limit", "requests this process holds open at most", registry=r
        )
        self.open_requests = Gauge(
            f"{NS}_open_requests",
            "requests this process holds now: being dispatched or streaming",
            registry=r,
        )
        self.brownouts = Counter(
            f"{NS}_brownouts_total",
            "new workflows sent to another engine because the chosen one's queue was over its bound",
            ["from_engine", "to_engine"],
            registry=r,
        )
        self.reattached_total = Counter(
            f"{NS}_reattached_total",
            "retries of a request id that streamed the existing request again instead of running it twice",
            ["engine"],
            registry=r,
        )
        self.degraded = Counter(
            f"{NS}_degraded_total",
            "dispatches that fell back because a dependency failed",
            ["dependency"],
            registry=r,
        )
        self.queue_wait = Histogram(
            f"{NS}_queue_wait_seconds",
            "first claim minus enqueue: time waiting in the engine's queue",
            em,
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.age_at_dispatch = Histogram(
            f"{NS}_age_at_dispatch_seconds",
            "first claim minus arrival at the front door: how old a request is when an engine takes it",
            em,
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            f"{NS}_e2e_seconds",
            "arrival to final answer of completed requests",
            em,
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.predicted_tokens = Histogram(
            f"{NS}_predicted_tokens",
            "predicted remaining workflow tokens (p50) at dispatch",
            ["model"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.realized_tokens = Histogram(
            f"{NS}_realized_tokens",
            "output tokens a program really produced from a stage on (observed when the program ends)",
            ["model"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.token_ratio = Histogram(
            f"{NS}_realized_over_predicted",
            "realized / predicted remaining tokens per stage (1 is a perfect prediction)",
            ["model"],
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        self.confidence = Histogram(
            f"{NS}_router_confidence",
            "router confidence q[m] of the model chosen for a new program",
            ["model"],
            buckets=CONFIDENCE_BUCKETS,
            registry=r,
        )
        self.calibration_programs = Counter(
            f"{NS}_calibration_programs_total",
            "programs ended with an outcome, by chosen model and its confidence decile (upper edge)",
            ["model", "confidence"],
            registry=r,
        )
        self.calibration_outcome = Counter(
            f"{NS}_calibration_outcome_total",
            "sum of those programs' outcomes: divided by the programs, the realized success rate",
            ["model", "confidence"],
            registry=r,
        )

    # --- dispatch ---------------------------------------------------------------------------------------

    def accepted(self, d: Dispatched, branch: str, confidences: dict[str, float]) -> None:
        self.dispatched.labels(d.engine, d.model).inc()
        self.dispatch_seconds.labels(branch).observe(d.dispatch_ms / 1000.0)
        self.predicted_tokens.labels(d.model).observe(d.prediction.p50)
        for dep in d.degraded:
            self.degraded.labels(dep).inc()
        if branch == "new" and d.model in confidences:
            self.confidence.labels(d.model).observe(confidences[d.model])

    def limits(self, bound_s: float, margin: float, max_open: int, open_now: Callable[[], float]) -> None:
        """The admission limits this process runs with, and how many requests it holds (read per scrape)."""
        self.queue_bound.set(bound_s)
        self.brownout_margin.set(margin)
        self.open_requests_limit.set(max_open)
        self.open_requests.set_function(open_now)

    def reattached(self, engine: str) -> None:
        self.reattached_total.labels(engine).inc()

    def browned_out(self, from_engine: str, to_engine: str) -> None:
        self.brownouts.labels(from_engine, to_engine).inc()

    def refused(self, code: str) -> None:
        self.errors.labels(code, "dispatch").inc()

    def upstream(self, dependency: str, seconds: float, ok: bool) -> None:
        self.upstream_seconds.labels(dependency, "ok" if ok else "error").observe(seconds)

    # --- RequestObserver: the end of a dispatched request's stream -------------------------------------

    def finished(self, d: Dispatched, final: Final) -> None:
        if final.finish_reason == "cancelled":
            self.cancelled.labels(d.engine, d.model).inc()
            return
        self.completed.labels(d.engine, d.model).inc()
        self.queue_wait.labels(d.engine, d.model).observe(final.queue_wait_s)
        received = d.request.received_unix or d.enqueued_unix
        age = max(0.0, d.enqueued_unix - received) + final.queue_wait_s
        self.age_at_dispatch.labels(d.engine, d.model).observe(age)
        self.e2e.labels(d.engine, d.model).observe(final.e2e_s)
        self._add_tokens(d, final.completion_tokens)

    def failed_with(self, d: Dispatched, code: str) -> None:
        self.failed.labels(d.engine, d.model, code).inc()
        self.errors.labels(code, "stream").inc()

    def abandoned(self, d: Dispatched) -> None:
        self.cancelled.labels(d.engine, d.model).inc()

    # --- programs ---------------------------------------------------------------------------------------

    def _add_tokens(self, d: Dispatched, tokens: int) -> None:
        pid = d.request.program_id
        prog = self._open.pop(pid, None) or _Program()
        self._open[pid] = prog  # most recently used last, so eviction drops the stalest
        prog.stages.append(_Stage(d.model, d.prediction.p50))
        for st in prog.stages:
            st.realized += tokens
        while len(self._open) > self._max_open:
            self._open.popitem(last=False)

    def program_ended(self, program_id: str, program: dict[str, str], outcome: float | None) -> None:
        """EndProgram: observe its stages' token predictions and, with an outcome, the router calibration."""
        prog = self._open.pop(program_id, None)
        for st in prog.stages if prog else ():
            self.realized_tokens.labels(st.model).observe(st.realized)
            self.token_ratio.labels(st.model).observe(st.realized / max(1, st.predicted))
        if outcome is None:
            return
        model = program.get(ProgramField.MODEL, "")
        try:
            q = json.loads(program.get(ProgramField.CONFIDENCES) or "{}").get(model)
        except (ValueError, AttributeError):
            q = None
        if q is None:
            return  # pinned or degraded: no router confidence to calibrate
        bucket = confidence_bucket(float(q))
        self.calibration_programs.labels(model, bucket).inc()
        self.calibration_outcome.labels(model, bucket).inc(outcome)


class EngineCollector(Collector):
    """Per-engine queue depth, running requests, in-flight predicted tokens and the age of the oldest
    waiting request, read from Redis per scrape.

    It runs in the exporter's thread with its own synchronous client, so a scrape never waits on (or
    blocks) the dispatcher's event loop, and the numbers are as fresh as the scrape. The oldest age shows
    starvation while it happens (the age-at-dispatch histogram only sees a request once it is served); it
    looks at the ``oldest_sample`` worst-placed requests, which is where a starving request sits.
    """

    def __init__(
        self,
        redis: SyncRedis,
        keys: Keys,
        dead_after_s: float,
        clock: Callable[[], float] = time.time,
        oldest_sample: int = 256,
    ) -> None:
        self._r, self._k, self._dead_after_s, self._clock = redis, keys, dead_after_s, clock
        self._sample = oldest_sample

    def describe(self) -> Iterable[Metric]:
        return []  # the series depend on which engines registered; nothing to check at registration

    def collect(self) -> Iterable[Metric]:
        em = ["engine", "model"]
        depth = GaugeMetricFamily(
            "chimera_engine_queue_depth", "requests waiting in the engine's queue", labels=em
        )
        running = GaugeMetricFamily(
            "chimera_engine_running", "requests claimed by the engine's workers", labels=em
        )
        tokens = GaugeMetricFamily(
            "chimera_engine_inflight_predicted_tokens",
            "predicted remaining tokens of the engine's queued and running requests (its load)",
            labels=em,
        )
        alive = GaugeMetricFamily(
            "chimera_engine_alive", "1 while the engine heartbeats and has a profile", labels=em
        )
        oldest = GaugeMetricFamily(
            "chimera_engine_oldest_queued_age_seconds",
            "age of the oldest request still waiting in the engine's queue (0 when empty)",
            labels=em,
        )
        work = GaugeMetricFamily(
            "chimera_engine_queue_work_seconds",
            "predicted seconds of work the engine holds: its load priced by its profile",
            labels=em,
        )
        up = GaugeMetricFamily(
            "chimera_dispatcher_redis_up", "1 if this scrape could read the engines from Redis"
        )
        try:
            snaps, ages = self._read()
        except RedisError as e:
            log.warning("metrics scrape could not read engines: %s", e)
            up.add_metric([], 0)
            return [up]
        for s, age in zip(snaps, ages, strict=True):
            labels = [s.engine_id, s.model]
            oldest.add_metric(labels, age)
            depth.add_metric(labels, s.queued)
            running.add_metric(labels, s.running)
            tokens.add_metric(labels, s.inflight_tokens)
            work.add_metric(labels, work_s(s))
            alive.add_metric(labels, 1 if s.alive else 0)
        up.add_metric([], 1)
        return [depth, running, tokens, work, alive, oldest, up]

    def _read(self) -> tuple[list[EngineSnapshot], list[float]]:
        k = self._k
        ids = sorted(str(e) for e in self._r.smembers(k.engines()))
        if not ids:
            return [], []
        pipe = self._r.pipeline(transaction=False)
        for eid in ids:
            pipe.hgetall(k.engine_info(eid))
            pipe.zcard(k.queue(eid))
            pipe.zcard(k.claims(eid))
            pipe.zrange(k.queue(eid), -self._sample, -1)
        res = pipe.execute()
        now = self._clock()
        snaps = [
            parse_engine(
                eid, dict(res[4 * i]), int(res[4 * i + 1]), int(res[4 * i + 2]), now, self._dead_after_s
            )
            for i, eid in enumerate(ids)
        ]
        waiting = [[str(r) for r in res[4 * i + 3]] for i in range(len(ids))]
        pipe = self._r.pipeline(transaction=False)
        for eid, rids in zip(ids, waiting, strict=True):
            for rid in rids:
                pipe.hget(k.request(eid, rid), RequestField.T_ENQ)
        t_enq = iter(pipe.execute())
        ages = []
        for rids in waiting:
            times = [float(t) for t in (next(t_enq) for _ in rids) if t is not None]
            ages.append(max(0.0, now - min(times)) if times else 0.0)
        return snaps, ages


@contextlib.contextmanager
def metrics_endpoint(s: DispatcherSettings) -> Iterator[DispatcherMetrics]:
    """A process's registry with the engine gauges, served on ``host:metrics_port`` while the block runs."""
    registry, scrape_redis = CollectorRegistry(), connect_sync(s.redis_url)
    registry.register(EngineCollector(scrape_redis, Keys(s.key_prefix), s.engine_dead_after_s))
    registry.register(JobRunsCollector(scrape_redis, Keys(s.key_prefix)))
    exporter = start_exporter(registry, s.host, s.metrics_port)
    try:
        yield DispatcherMetrics(registry)
    finally:
        if exporter is not None:
            exporter.stop()
        scrape_redis.close()
