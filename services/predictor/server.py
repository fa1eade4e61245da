"""Predictor gRPC server: proto <-> dataclasses, domain errors -> status codes, lifecycle."""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from chimera.predictor.v1 import predictor_pb2, predictor_pb2_grpc
from services.common.artifacts import ArtifactMeta
from services.common.batching import BatchCollector, CollectorClosedError, CollectorOptions, NoArtifactError
from services.common.metrics import ModelServiceMetrics, start_exporter
from services.predictor.config import PredictorSettings
from services.predictor.errors import BadRequestError, PredictorError, TooManyRowsError, UnknownModelError
from services.predictor.features import PredictorInput
from services.predictor.inference import PredictItem, predict_batch
from services.predictor.service import PredictorService

log = logging.getLogger(__name__)

SERVICE_NAME = predictor_pb2.DESCRIPTOR.services_by_name["Predictor"].full_name
_STATUS: dict[type[Exception], grpc.StatusCode] = {
    BadRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    TooManyRowsError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    UnknownModelError: grpc.StatusCode.NOT_FOUND,
    NoArtifactError: grpc.StatusCode.UNAVAILABLE,
    CollectorClosedError: grpc.StatusCode.UNAVAILABLE,
}
Resp = TypeVar("Resp")


def _status_codes(
    fn: Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Resp]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Resp]]:
    """The one place where domain errors become gRPC status codes."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Resp:
        t0, code = time.perf_counter(), grpc.StatusCode.OK
        try:
            return await fn(self, request, context)
        except (PredictorError, NoArtifactError, CollectorClosedError) as e:
            code = next(c for t, c in _STATUS.items() if isinstance(e, t))
            await context.abort(code, str(e))
        except Exception:
            log.exception("predictor call failed")
            code = grpc.StatusCode.INTERNAL
            await context.abort(code, "predictor inference failed")
        finally:
            self.metrics.observe_call(fn.__name__, code.name, time.perf_counter() - t0)
        raise AssertionError("unreachable: abort raises")

    return wrapper


class PredictorServicer(predictor_pb2_grpc.PredictorServicer):  # type: ignore[misc]
    def __init__(self, service: PredictorService, metrics: ModelServiceMetrics) -> None:
        self._service = service
        self.metrics = metrics

    @_status_codes
    async def Predict(  # noqa: N802 (gRPC method name)
        self, request: predictor_pb2.PredictRequest, context: grpc.aio.ServicerContext
    ) -> predictor_pb2.PredictResponse:
        rows = [
            PredictorInput(
                model=r.model,
                workflow=r.workflow,
                stage=r.stage,
                system_text=r.system_text,
                user_text=r.user_text,
                prompt_text=r.prompt_text,
            )
            for r in request.rows
        ]
        out = await self._service.predict(rows, list(request.quantiles))
        return predictor_pb2.PredictResponse(
            predictions=[predictor_pb2.Quantiles(values=v) for v in out.values],
            quantiles=list(out.quantiles),
            artifact_version=out.version,
        )

    @_status_codes
    async def Describe(  # noqa: N802
        self, request: predictor_pb2.DescribeRequest, context: grpc.aio.ServicerContext
    ) -> predictor_pb2.DescribeResponse:
        meta = self._service.describe()
        return predictor_pb2.DescribeResponse(
            backend=meta.backend, artifact_version=meta.version, models=list(meta.models)
        )


class PredictorServer:
    """A started predictor: gRPC server, health, reflection and the batch collector, stopped together."""

    def __init__(self, settings: PredictorSettings, metrics: ModelServiceMetrics | None = None) -> None:
        self.settings = settings
        # Without one from __main__ (tests), metrics go to a private registry nobody scrapes.
        self.metrics = metrics or ModelServiceMetrics(CollectorRegistry(), "predictor")
        self.health = health.aio.HealthServicer()
        self._health_tasks: set[asyncio.Task[None]] = set()
        self.collector: BatchCollector[PredictItem, tuple[float, ...]] = BatchCollector(
            settings.artifact_dir,
            predict_batch,
            CollectorOptions(
                max_batch_size=settings.max_batch_size,
                max_wait_ms=settings.max_wait_ms,
                pool_workers=settings.pool_workers,
                reload_interval_s=settings.reload_interval_s,
                on_batch=self.metrics.on_batch,
                on_reload=self._on_reload,
            ),
        )
        self.server = grpc.aio.server()
        self.port = 0

    def _on_reload(self, meta: ArtifactMeta) -> None:
        self.metrics.on_reload(meta)
        task = asyncio.create_task(self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING))
        self._health_tasks.add(task)
        task.add_done_callback(self._health_tasks.discard)

    async def start(self) -> int:
        """Load the artifact (if any), bind, start serving; returns the bound port."""
        s = self.settings
        predictor_pb2_grpc.add_PredictorServicer_to_server(
            PredictorServicer(PredictorService(self.collector, s.max_request_items), self.metrics),
            self.server,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, self.server)
        # The named service is SERVING only once an artifact is loaded; the process itself is up now.
        await self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.collector.start()
        self.port = self.server.add_insecure_port(f"{s.host}:{s.port}")
        await self.server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        log.info("serving on %s:%d", s.host, self.port)
        return self.port

    async def stop(self) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(self.settings.grace_s)
        await self.collector.close()


async def run(settings: PredictorSettings, metrics: ModelServiceMetrics) -> None:
    """Serve (and ``/metrics`` on ``metrics_port``) until SIGTERM or SIGINT, then drain gracefully."""
    server = PredictorServer(settings, metrics)
    exporter = start_exporter(metrics.registry, settings.host, settings.metrics_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    await stop.wait()
    log.info("stopping")
    await server.stop()
    if exporter is not None:
        exporter.stop()
