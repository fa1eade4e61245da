"""The worker's Prometheus metrics: claims, running sequences, stage run time, tokens, and the failure paths
(engine errors, lost leases, requests put back in the queue, registrations written again)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.common.metrics import WAIT_BUCKETS

NS = "chimera_worker"


class WorkerMetrics:
    """Recorders for one worker process (one engine); every series carries the engine and its model."""

    def __init__(self, registry: CollectorRegistry, engine: str, model: str) -> None:
        self.registry = registry
        em = ["engine", "model"]
        r = registry
        self._labels = (engine, model)
        self._claims = Counter(
            f"{NS}_claims_total", "requests claimed from the engine's queue", em, registry=r
        )
        self._running = Gauge(f"{NS}_running_sequences", "sequences running in the engine", em, registry=r)
        self._held = Gauge(
            f"{NS}_held_claims",
            "claims held (running or about to start; includes the prefetch)",
            em,
            registry=r,
        )
        self._finished = Counter(
            f"{NS}_requests_total",
            "requests this worker ended, by outcome (a finish reason, deadline_exceeded, failed or lost)",
            [*em, "outcome"],
            registry=r,
        )
        self._run_s = Histogram(
            f"{NS}_stage_run_seconds",
            "engine time of a completed stage, from its start to its last token",
            em,
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self._tokens = Counter(
            f"{NS}_tokens_generated_total", "output tokens of completed stages", em, registry=r
        )
        self._engine_errors = Counter(
            f"{NS}_engine_errors_total",
            "engine failures: dead (the engine stopped) or request (one request raised)",
            [*em, "kind"],
            registry=r,
        )
        self._lease_losses = Counter(
            f"{NS}_lease_losses_total",
            "held requests whose lease was lost (re-run elsewhere)",
            em,
            registry=r,
        )
        self._reregistrations = Counter(
            f"{NS}_reregistrations_total",
            "heartbeats that found the engine's registration gone (Redis lost its data) and wrote it again",
            em,
            registry=r,
        )
        self._requeued = Counter(
            f"{NS}_reaper_requeued_total",
            "claims this worker put back in the queue: expired ones (its reaper), its own (its engine died)",
            em,
            registry=r,
        )

    def reregistered(self) -> None:
        self._reregistrations.labels(*self._labels).inc()

    def claimed(self, n: int) -> None:
        self._claims.labels(*self._labels).inc(n)

    def occupancy(self, running: int, held: int) -> None:
        self._running.labels(*self._labels).set(running)
        self._held.labels(*self._labels).set(held)

    def ended(self, outcome: str) -> None:
        self._finished.labels(*self._labels, outcome).inc()

    def completed(self, finish_reason: str, run_s: float, tokens: int) -> None:
        self.ended(finish_reason)
        self._run_s.labels(*self._labels).observe(run_s)
        self._tokens.labels(*self._labels).inc(tokens)

    def engine_error(self, kind: str) -> None:
        self._engine_errors.labels(*self._labels, kind).inc()

    def lease_lost(self) -> None:
        self._lease_losses.labels(*self._labels).inc()

    def requeued(self, n: int) -> None:
        self._requeued.labels(*self._labels).inc(n)
