"""What the model services (router, predictor) share: settings, error -> status map, lifecycle, run loop.

Each service's ``server.py`` keeps only what differs: its servicer (proto <-> dataclasses), its error map and
how it registers the servicer. Logger names stay ``services.<label>.server`` so log lines read as before.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry
from pydantic import Field, FilePath, model_validator

from services.common import grpc_status, tls
from services.common.artifacts import ArtifactMeta, load_version
from services.common.batching import (
    BatchCollector,
    BatchFn,
    BatchStat,
    CollectorClosedError,
    CollectorOptions,
    Loader,
    NoArtifactError,
)
from services.common.config import CommonSettings
from services.common.grpc_status import by_type
from services.common.metrics import ModelServiceMetrics, start_exporter

Resp = TypeVar("Resp")
ItemT = TypeVar("ItemT")
OutT = TypeVar("OutT")
Method = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Resp]]


class ModelServiceSettings(CommonSettings):
    """Knobs shared by the model services (router, predictor); each sets its env prefix and defaults."""

    host: str = Field(default="127.0.0.1", min_length=1, description="address the gRPC server binds")
    port: int = Field(default=0, ge=0, le=65535, description="gRPC port (0 picks a free one)")
    metrics_port: int = Field(
        default=0, ge=0, le=65535, description="Prometheus /metrics port on host (0 picks a free one)"
    )
    artifact_dir: Path = Field(
        default=Path(".chimera/artifacts/model"),
        description="this service's artifact directory: <dir>/CURRENT names the version to serve",
    )
    max_batch_size: int = Field(
        default=32,
        ge=1,
        le=4096,
        description="items per inference batch, at most (threads and processes; the loop answers each call at"
        " once)",
    )
    # 1 ms: a lone call pays the whole window (5 ms cost 9.5-10.5 ms p50 per call in
    # bench/results/predictors.md), while under load batches fill to max_batch_size well before it.
    max_wait_ms: float = Field(
        default=1.0,
        ge=0.0,
        le=10_000.0,
        description="a batch closes this long after its first item arrives (threads and processes)",
    )
    pool_workers: int = Field(
        default=1, ge=1, le=64, description="inference workers, processes or threads (batches run at once)"
    )
    # Threads by default: the shipped models (tf-idf and MiniLM heads, quantile forests) spend their time
    # in numpy, scikit-learn or torch, which release the GIL, and a process pool's pickling and feeder
    # threads cost more CPU per call than the model (bench/results/load.md).
    executor: Literal["process", "thread", "loop", "auto"] = Field(
        default="auto",
        description="where inference runs: a thread pool here, worker processes, the event loop itself, or"
        " auto: the loop for the CPU backends that answer in microseconds (tf-idf, prior, forests), threads"
        " for the rest",
    )
    reload_interval_s: float = Field(
        default=2.0, gt=0.0, le=3600.0, description="how often CURRENT is checked"
    )
    max_request_items: int = Field(default=256, ge=1, description="items one call may carry")
    grace_s: float = Field(
        default=5.0, ge=0.0, le=300.0, description="drain time for in-flight calls on shutdown"
    )
    tls_cert_file: FilePath | None = Field(
        default=None, description="certificate chain (PEM) the gRPC server presents; unset: plaintext"
    )
    tls_key_file: FilePath | None = Field(default=None, description="private key (PEM) of tls_cert_file")
    tls_client_ca_file: FilePath | None = Field(
        default=None,
        description="CA bundle (PEM): when set, only clients with a certificate it signs are served (mTLS)",
    )

    @model_validator(mode="after")
    def _tls_complete(self) -> ModelServiceSettings:
        prefix = str(self.model_config.get("env_prefix", ""))
        tls.check_server(self.tls_cert_file, self.tls_key_file, self.tls_client_ca_file, env=prefix.upper())
        return self


def model_collector(
    settings: ModelServiceSettings,
    batch_fn: BatchFn[ItemT, OutT],
    *,
    on_batch: Callable[[BatchStat], None] | None = None,
    on_reload: Callable[[ArtifactMeta], None] | None = None,
    loader: Loader = load_version,
    loop_backends: frozenset[str] = frozenset(),
) -> BatchCollector[ItemT, OutT]:
    """The batch collector a model service serves from, built from its settings. The dispatcher's inline
    inference (``services.dispatcher.inline``) builds its own with this too, so both load, batch and hot
    reload the same artifacts the same way; ``loader`` lets it refuse backends it must not run."""
    return BatchCollector(
        settings.artifact_dir,
        batch_fn,
        CollectorOptions(
            max_batch_size=settings.max_batch_size,
            max_wait_ms=settings.max_wait_ms,
            pool_workers=settings.pool_workers,
            executor=settings.executor,
            reload_interval_s=settings.reload_interval_s,
            on_batch=on_batch,
            on_reload=on_reload,
            loader=loader,
            loop_backends=loop_backends,
        ),
    )


def _logger(label: str) -> logging.Logger:
    return logging.getLogger(f"services.{label}.server")


def status_codes(
    errors: Mapping[type[Exception], grpc.StatusCode], label: str
) -> Callable[[Method[Resp]], Method[Resp]]:
    """The model services' ``grpc_status.status_codes``: ``errors`` maps each domain error type to its code
    (first match wins), to which the collector's errors are added as UNAVAILABLE; any other exception is
    logged and becomes INTERNAL. The servicer must have a ``metrics`` attribute (a ``ModelServiceMetrics``).
    """
    # Every model service answers from a batch collector, so its errors map the same way everywhere.
    codes: dict[type[Exception], grpc.StatusCode] = {
        **errors,
        NoArtifactError: grpc.StatusCode.UNAVAILABLE,
        CollectorClosedError: grpc.StatusCode.UNAVAILABLE,
    }

    def observe(servicer: Any, method: str, code: str, seconds: float) -> None:
        servicer.metrics.observe_call(method, code, seconds)

    return grpc_status.status_codes(by_type(codes), _logger(label), f"{label} inference failed", observe)


class ModelServer(abc.ABC, Generic[ItemT, OutT]):
    """A started model service: gRPC server, health, reflection and the batch collector, stopped together.

    A subclass passes its label, gRPC service name and batch function, and registers its servicer in
    ``add_servicer``.
    """

    def __init__(
        self,
        settings: ModelServiceSettings,
        metrics: ModelServiceMetrics | None,
        *,
        label: str,
        service_name: str,
        batch_fn: BatchFn[ItemT, OutT],
        loop_backends: frozenset[str] = frozenset(),
    ) -> None:
        self.settings = settings
        self.service_name = service_name
        self.log = _logger(label)
        # Without one from __main__ (tests), metrics go to a private registry nobody scrapes.
        self.metrics = metrics or ModelServiceMetrics(CollectorRegistry(), label)
        self.health = health.aio.HealthServicer()
        self._health_tasks: set[asyncio.Task[None]] = set()
        self.collector: BatchCollector[ItemT, OutT] = model_collector(
            settings,
            batch_fn,
            on_batch=self.metrics.on_batch,
            on_reload=self._on_reload,
            loop_backends=loop_backends,
        )
        self.server = grpc.aio.server()
        self.port = 0

    @abc.abstractmethod
    def add_servicer(self) -> None:
        """Register this service's servicer (built on ``self.collector``) on ``self.server``."""

    def _on_reload(self, meta: ArtifactMeta) -> None:
        self.metrics.on_reload(meta)
        task = asyncio.create_task(self.health.set(self.service_name, health_pb2.HealthCheckResponse.SERVING))
        self._health_tasks.add(task)
        task.add_done_callback(self._health_tasks.discard)

    async def start(self) -> int:
        """Load the artifact (if any), bind, start serving; returns the bound port."""
        s = self.settings
        self.add_servicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (self.service_name, health.SERVICE_NAME, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, self.server)
        # The named service is SERVING only once an artifact is loaded; the process itself is up now.
        await self.health.set(self.service_name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.collector.start()
        transport = tls.server_tls(s.tls_cert_file, s.tls_key_file, s.tls_client_ca_file)
        self.port = tls.add_port(self.server, f"{s.host}:{s.port}", transport)
        await self.server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.log.info("serving on %s:%d (%s)", s.host, self.port, tls.describe(transport))
        return self.port

    async def stop(self) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(self.settings.grace_s)
        await self.collector.close()


async def serve_until_signalled(server: ModelServer[Any, Any], metrics: ModelServiceMetrics) -> None:
    """Serve (and ``/metrics`` on ``metrics_port``) until SIGTERM or SIGINT, then drain gracefully."""
    settings = server.settings
    exporter = start_exporter(metrics.registry, settings.host, settings.metrics_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    await stop.wait()
    server.log.info("stopping")
    await server.stop()
    if exporter is not None:
        exporter.stop()
