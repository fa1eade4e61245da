"""Clients of the router and predictor services, behind two small protocols.

The dispatcher depends on the protocols only, so tests inject fakes and ``inline`` replaces the gRPC hop
(``CHIMERA_DISPATCHER_INFERENCE=inline``) without touching dispatch logic. Every call has its own
deadline: a slow dependency must cost the front door a bounded amount of time (the dispatcher then
degrades; see ``dispatch``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any, Protocol, TypeVar

import grpc

from chimera.predictor.v1 import predictor_pb2, predictor_pb2_grpc
from chimera.router.v1 import router_pb2, router_pb2_grpc
from services.common.types import Prediction, StageRequest

QUANTILES = (0.5, 0.9)


class ConfidenceSource(Protocol):
    async def score(self, text: str, workflow: str, models: Sequence[str]) -> Mapping[str, float]:
        """Per-model success confidence q[m] in [0, 1] for a workflow's task text."""
        ...


class LengthSource(Protocol):
    async def predict(self, request: StageRequest, models: Sequence[str]) -> Mapping[str, Prediction]:
        """Predicted remaining output tokens of the workflow (this stage and later ones) on each model.

        Several models in one call: a first stage asks for every candidate while the router scores them,
        so neither waits for the other and the chosen model's prediction is there when the policy picks.
        """
        ...


class UpstreamError(Exception):
    """A dependency answered with an error or an unusable response."""


class RouterClient:
    def __init__(self, channel: grpc.aio.Channel, timeout_s: float) -> None:
        self._stub = router_pb2_grpc.RouterStub(channel)
        self._timeout_s = timeout_s

    async def score(self, text: str, workflow: str, models: Sequence[str]) -> Mapping[str, float]:
        return (await self.score_many([(text, workflow)], models))[0]

    async def score_many(
        self, items: Sequence[tuple[str, str]], models: Sequence[str]
    ) -> list[Mapping[str, float]]:
        """q[m] for each (text, workflow), in one call."""
        req = router_pb2.ScoreRequest(
            items=[router_pb2.RouterInput(text=text, workflow=wf) for text, wf in items], models=list(models)
        )
        try:
            resp = await self._stub.Score(req, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as e:
            raise UpstreamError(f"router: {e.code().name}: {e.details()}") from e
        if len(resp.scores) != len(items):
            raise UpstreamError(f"router returned {len(resp.scores)} score rows for {len(items)} items")
        return [{m: min(1.0, max(0.0, float(v))) for m, v in row.confidence.items()} for row in resp.scores]


R = TypeVar("R")


def feature_rows(
    request: StageRequest, models: Sequence[str], row: Callable[..., R], loop: Callable[..., Any]
) -> list[R]:
    """The predictor's feature rows for ``request``, one per model, built by ``row`` and ``loop``: the gRPC
    messages (``PredictorClient``) or the in-process input (``inline.InlinePredictor``), from the same
    fields."""
    system, user, prompt = request.system_text(), request.user_text(), request.prompt_text()
    extra = {} if request.loop is None else {"loop": loop(**asdict(request.loop))}
    return [
        row(
            model=m,
            workflow=request.workflow,
            stage=request.stage,
            system_text=system,
            user_text=user,
            prompt_text=prompt,
            **extra,
        )
        for m in models
    ]


class PredictorClient:
    def __init__(self, channel: grpc.aio.Channel, timeout_s: float) -> None:
        self._stub = predictor_pb2_grpc.PredictorStub(channel)
        self._timeout_s = timeout_s

    async def predict(self, request: StageRequest, models: Sequence[str]) -> Mapping[str, Prediction]:
        return (await self.predict_many([(request, tuple(models))]))[0]

    async def predict_many(
        self, asks: Sequence[tuple[StageRequest, Sequence[str]]]
    ) -> list[Mapping[str, Prediction]]:
        """Predictions for several requests (each on its models), in one call."""
        pb = predictor_pb2
        rows = [r for ask, models in asks for r in feature_rows(ask, models, pb.FeatureRow, pb.LoopState)]
        req = predictor_pb2.PredictRequest(rows=rows, quantiles=list(QUANTILES))
        try:
            resp = await self._stub.Predict(req, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as e:
            raise UpstreamError(f"predictor: {e.code().name}: {e.details()}") from e
        if len(resp.predictions) != len(rows):
            raise UpstreamError(f"predictor returned {len(resp.predictions)} rows for {len(rows)}")
        quantiles = list(resp.quantiles) or list(QUANTILES)
        out: list[Mapping[str, Prediction]] = []
        at = 0
        for _, models in asks:
            values = resp.predictions[at : at + len(models)]
            out.append(
                {
                    m: prediction_from_quantiles(quantiles, list(p.values))
                    for m, p in zip(models, values, strict=True)
                }
            )
            at += len(models)
        return out


def prediction_from_quantiles(quantiles: Sequence[float], values: Sequence[float]) -> Prediction:
    """Pick p50 and p90 out of an aligned quantile response.

    Predictions are at least 1 token: a zero would drop the request from its engine's load accounting.
    """
    if len(quantiles) != len(values) or not values:
        raise UpstreamError(f"predictor returned {len(values)} values for {len(quantiles)} quantiles")
    by_q = {round(float(q), 6): float(v) for q, v in zip(quantiles, values, strict=True)}
    if 0.5 not in by_q:
        raise UpstreamError("predictor response has no median")
    p50 = max(1, round(by_q[0.5]))
    p90 = max(p50, round(by_q.get(0.9, by_q[0.5])))
    return Prediction(p50=p50, p90=p90)
