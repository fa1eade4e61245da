"""Predictor gRPC server: proto <-> dataclasses and the predictor's domain errors -> status codes.

The lifecycle (health, reflection, batch collector, signals) is shared with the router in
``services.common.model_service``.
"""

from __future__ import annotations

import grpc

from chimera.predictor.v1 import predictor_pb2, predictor_pb2_grpc
from services.common.metrics import ModelServiceMetrics
from services.common.model_service import ModelServer, serve_until_signalled, status_codes
from services.common.types import LoopState
from services.predictor.backends import INLINE_BACKENDS
from services.predictor.config import PredictorSettings
from services.predictor.errors import BadRequestError, TooManyRowsError, UnknownModelError
from services.predictor.features import PredictorInput
from services.predictor.inference import PredictItem, predict_batch
from services.predictor.service import PredictorService

SERVICE_NAME = predictor_pb2.DESCRIPTOR.services_by_name["Predictor"].full_name
_STATUS: dict[type[Exception], grpc.StatusCode] = {
    BadRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    TooManyRowsError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    UnknownModelError: grpc.StatusCode.NOT_FOUND,
}
_status_codes = status_codes(_STATUS, "predictor")


def loop_state(m: predictor_pb2.LoopState) -> LoopState:
    return LoopState(m.turn, m.attained_tokens, m.last_tool_failed, m.last_tool_chars, m.last_output_tokens)


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
                loop=loop_state(r.loop) if r.HasField("loop") else None,
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


class PredictorServer(ModelServer[PredictItem, tuple[float, ...]]):
    """A started predictor: gRPC server, health, reflection and the batch collector, stopped together."""

    def __init__(self, settings: PredictorSettings, metrics: ModelServiceMetrics | None = None) -> None:
        super().__init__(
            settings,
            metrics,
            label="predictor",
            service_name=SERVICE_NAME,
            batch_fn=predict_batch,
            loop_backends=INLINE_BACKENDS,
        )
        self.settings: PredictorSettings = settings

    def add_servicer(self) -> None:
        service = PredictorService(self.collector, self.settings.max_request_items)
        predictor_pb2_grpc.add_PredictorServicer_to_server(
            PredictorServicer(service, self.metrics), self.server
        )


async def run(settings: PredictorSettings, metrics: ModelServiceMetrics) -> None:
    """Serve (and ``/metrics`` on ``metrics_port``) until SIGTERM or SIGINT, then drain gracefully."""
    await serve_until_signalled(PredictorServer(settings, metrics), metrics)
