"""Router gRPC server: proto <-> dataclasses and the router's domain errors -> status codes.

The lifecycle (health, reflection, batch collector, signals) is shared with the predictor in
``services.common.model_service``.
"""

from __future__ import annotations

import grpc

from chimera.router.v1 import router_pb2, router_pb2_grpc
from services.common.metrics import ModelServiceMetrics
from services.common.model_service import ModelServer, serve_until_signalled, status_codes
from services.router.backends import INLINE_BACKENDS
from services.router.config import RouterSettings
from services.router.errors import BadRequestError, TooManyItemsError, UnknownModelError
from services.router.inference import RouterItem, score_batch
from services.router.service import RouterService

SERVICE_NAME = router_pb2.DESCRIPTOR.services_by_name["Router"].full_name
_STATUS: dict[type[Exception], grpc.StatusCode] = {
    BadRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    TooManyItemsError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    UnknownModelError: grpc.StatusCode.NOT_FOUND,
}
_status_codes = status_codes(_STATUS, "router")


class RouterServicer(router_pb2_grpc.RouterServicer):  # type: ignore[misc]
    def __init__(self, service: RouterService, metrics: ModelServiceMetrics) -> None:
        self._service = service
        self.metrics = metrics

    @_status_codes
    async def Score(  # noqa: N802 (gRPC method name)
        self, request: router_pb2.ScoreRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.ScoreResponse:
        items = [RouterItem(text=i.text, workflow=i.workflow) for i in request.items]
        scores = await self._service.score(items, list(request.models))
        return router_pb2.ScoreResponse(
            scores=[router_pb2.ModelScores(confidence=c) for c in scores.confidences],
            artifact_version=scores.version,
        )

    @_status_codes
    async def Describe(  # noqa: N802
        self, request: router_pb2.DescribeRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.DescribeResponse:
        meta = self._service.describe()
        return router_pb2.DescribeResponse(
            backend=meta.backend, artifact_version=meta.version, models=list(meta.models)
        )


class RouterServer(ModelServer[RouterItem, dict[str, float]]):
    """A started router: gRPC server, health, reflection and the batch collector, stopped together."""

    def __init__(self, settings: RouterSettings, metrics: ModelServiceMetrics | None = None) -> None:
        super().__init__(
            settings,
            metrics,
            label="router",
            service_name=SERVICE_NAME,
            batch_fn=score_batch,
            loop_backends=INLINE_BACKENDS,
        )
        self.settings: RouterSettings = settings

    def add_servicer(self) -> None:
        service = RouterService(self.collector, self.settings.max_request_items)
        router_pb2_grpc.add_RouterServicer_to_server(RouterServicer(service, self.metrics), self.server)


async def run(settings: RouterSettings, metrics: ModelServiceMetrics) -> None:
    """Serve (and ``/metrics`` on ``metrics_port``) until SIGTERM or SIGINT, then drain gracefully."""
    await serve_until_signalled(RouterServer(settings, metrics), metrics)
