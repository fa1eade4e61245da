"""Prometheus plumbing shared by every service: the ``/metrics`` exporter and the model-service metrics.

NOTE(metrics): nothing here touches prometheus-client's global default registry. Each process builds one
``CollectorRegistry`` in its ``__main__`` and hands it (inside a metrics object) to the code that records,
so two services in one test process, or two tests, never share a counter. The exporter serves the
registry from prometheus-client's own HTTP server thread, so a scrape (including custom collectors that
read Redis) never runs on, or blocks, the service's asyncio loop.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from services.common.artifacts import ArtifactMeta
from services.common.batching import BatchStat

log = logging.getLogger(__name__)

# Seconds: from sub-millisecond Redis round trips to multi-minute LLM stages.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOKEN_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
RATIO_BUCKETS = (0.125, 0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.33, 2.0, 4.0, 8.0)
CONFIDENCE_BUCKETS = tuple(round(0.1 * i, 1) for i in range(1, 11))


def confidence_bucket(q: float) -> str:
    """The upper edge of q's decile ("0.1" .. "1.0"), so a bucket label sorts and reads as a number."""
    q = min(1.0, max(0.0, q))
    edge = next(b for b in CONFIDENCE_BUCKETS if q <= b + 1e-12)
    return f"{edge:.1f}"


@dataclass
class MetricsExporter:
    """A started ``/metrics`` HTTP endpoint for one registry; ``port`` is the bound one (0 picks one)."""

    host: str
    port: int
    _server: WSGIServer
    _thread: threading.Thread

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_exporter(registry: CollectorRegistry, host: str, port: int) -> MetricsExporter | None:
    """Serve ``registry`` on http://host:port/metrics; logs the address.

    A port that cannot be bound is logged and the service carries on without metrics: losing the scrape
    endpoint must not take a serving process down (e.g. two processes started with the same default).
    """
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        log.error("metrics endpoint %s:%d could not be bound (%s); serving without /metrics", host, port, e)
        return None
    bound = int(server.server_port)
    log.info("metrics on http://%s:%d/metrics", host, bound)
    return MetricsExporter(host, bound, server, thread)


class ModelServiceMetrics:
    """Router or predictor: gRPC call latency and codes, inference batches, the artifact being served."""

    def __init__(self, registry: CollectorRegistry, service: str) -> None:
        ns = f"chimera_{service}"
        self.registry = registry
        self.calls = Histogram(
            f"{ns}_call_seconds",
            "gRPC call latency as the server sees it, by method and status code",
            ["method", "code"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.errors = Counter(
            f"{ns}_errors_total",
            "calls answered with a non-OK status, by code",
            ["method", "code"],
            registry=registry,
        )
        self.batch_size = Histogram(
            f"{ns}_batch_size", "items per inference batch", buckets=BATCH_BUCKETS, registry=registry
        )
        self.batch_requests = Histogram(
            f"{ns}_batch_requests",
            "calls merged into one inference batch",
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.batch_seconds = Histogram(
            f"{ns}_batch_seconds",
            "inference time of one batch in the process pool, by outcome",
            ["ok"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.artifact = Gauge(
            f"{ns}_artifact_info",
            "1 for the artifact version being served (labels say which)",
            ["version", "backend"],
            registry=registry,
        )
        self.reloads = Counter(f"{ns}_artifact_loads_total", "artifact versions loaded", registry=registry)

    def observe_call(self, method: str, code: str, seconds: float) -> None:
        self.calls.labels(method, code).observe(seconds)
        if code != "OK":
            self.errors.labels(method, code).inc()

    def on_batch(self, stat: BatchStat) -> None:
        """``CollectorOptions.on_batch``: runs on the event loop after every batch."""
        self.batch_size.observe(stat.size)
        self.batch_requests.observe(stat.requests)
        self.batch_seconds.labels("true" if stat.ok else "false").observe(stat.latency_s)

    def on_reload(self, meta: ArtifactMeta) -> None:
        # One series at a time: the old version's series is dropped so that sum() stays 1.
        self.artifact.clear()
        self.artifact.labels(meta.version, meta.backend).set(1)
        self.reloads.inc()
