"""Inline inference: the dispatcher runs the router's and the predictor's CPU models itself.

NOTE(inline): on a first stage the two gRPC hops cost far more CPU than the models they call
(bench/results/load.md: 3.6 and 3.5 CPU-ms per stage in the router and predictor processes, plus the
dispatcher's client side, against about 0.06 ms for a tf-idf score and 0.26 ms for a forest prediction of
two rows since their serving paths skip scikit-learn's per-call checks; a bare gRPC call costs 0.5 ms). With
``CHIMERA_DISPATCHER_INFERENCE=inline`` the dispatcher serves both from its own process through the
services' own parts: ``model_collector`` (the same ``CURRENT`` pointer and hot reload) and ``RouterService`` /
``PredictorService`` (the same checks). They read the services' own settings (``CHIMERA_ROUTER_*``,
``CHIMERA_PREDICTOR_*``: artifact folder, batch size and window, reload interval), so one set of knobs
describes a model wherever it runs.

With the default ``executor="auto"`` each call runs at once on the dispatcher's event loop: every backend
allowed here answers in well under a millisecond, and a thread hop and a batch window cost more CPU than that
(``CHIMERA_ROUTER_EXECUTOR=thread`` brings back micro-batching on a worker thread).

Answers pass through float32 as the gRPC messages do, so both modes make the same decisions. Only CPU
backends load (``INLINE_BACKENDS``): a transformer artifact is refused as a broken one is (the version
served before keeps serving; with none, dispatches degrade as when the router is down), and the log says to
serve it with ``inference=remote``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from services.common.artifacts import ArtifactError, load_meta, load_version
from services.common.metrics import ModelServiceMetrics
from services.common.model_service import ModelServiceSettings, model_collector
from services.common.types import LoopState, Prediction, StageRequest
from services.dispatcher.clients import (
    QUANTILES,
    ConfidenceSource,
    LengthSource,
    feature_rows,
    prediction_from_quantiles,
)
from services.predictor import backends as predictor_backends
from services.predictor.config import PredictorSettings
from services.predictor.features import PredictorInput
from services.predictor.inference import predict_batch
from services.predictor.service import PredictorService
from services.router import backends as router_backends
from services.router.config import RouterSettings
from services.router.inference import RouterItem, score_batch
from services.router.service import RouterService


def wire_float(x: float) -> float:
    """``x`` as it arrives over gRPC: the router's and predictor's messages carry float32."""
    return float(np.float32(x))


# The quantiles as the predictor service sees them from a remote dispatcher (float32 on the wire): a forest
# asked for 0.9 and for float32(0.9) can answer differently at a leaf boundary.
WIRE_QUANTILES = tuple(wire_float(q) for q in QUANTILES)


def cpu_only(allowed: frozenset[str], kind_dir: Path, version: str) -> Any:
    """A collector ``Loader`` that refuses a backend outside ``allowed`` before unpickling it."""
    meta = load_meta(kind_dir, version)
    if meta.backend not in allowed:
        raise ArtifactError(
            f"backend {meta.backend!r} of {version} is not run inside the dispatcher (only "
            f"{sorted(allowed)}); serve it from its service with CHIMERA_DISPATCHER_INFERENCE=remote"
        )
    return load_version(kind_dir, version)


class InlineRouter:
    """A ``ConfidenceSource`` answered in this process, as ``RouterClient`` answers from the service."""

    def __init__(self, service: RouterService, timeout_s: float) -> None:
        self._service = service
        self._timeout_s = timeout_s

    async def score(self, text: str, workflow: str, models: Sequence[str]) -> Mapping[str, float]:
        # The same deadline as a remote call: a backed-up batch must not hold a dispatch longer.
        async with asyncio.timeout(self._timeout_s):
            scores = await self._service.score([RouterItem(text=text, workflow=workflow)], models)
        return {m: min(1.0, max(0.0, wire_float(v))) for m, v in scores.confidences[0].items()}


class InlinePredictor:
    """A ``LengthSource`` answered in this process, as ``PredictorClient`` answers from the service."""

    def __init__(self, service: PredictorService, timeout_s: float) -> None:
        self._service = service
        self._timeout_s = timeout_s

    async def predict(self, request: StageRequest, models: Sequence[str]) -> Mapping[str, Prediction]:
        rows = feature_rows(request, models, PredictorInput, LoopState)
        async with asyncio.timeout(self._timeout_s):
            out = await self._service.predict(rows, WIRE_QUANTILES)
        quantiles = [wire_float(q) for q in out.quantiles]
        return {
            m: prediction_from_quantiles(quantiles, [wire_float(v) for v in values])
            for m, values in zip(models, out.values, strict=True)
        }


def _collector(
    settings: ModelServiceSettings,
    batch_fn: Any,
    label: str,
    allowed: frozenset[str],
    registry: CollectorRegistry | None,
) -> Any:
    """One model's collector as its service builds it, with the service's metrics names and only the CPU
    backends ``allowed`` loadable."""
    m = ModelServiceMetrics(registry or CollectorRegistry(), label)
    return model_collector(
        settings,
        batch_fn,
        on_batch=m.on_batch,
        on_reload=m.on_reload,
        loader=functools.partial(cpu_only, allowed),
        loop_backends=allowed,
    )


@contextlib.asynccontextmanager
async def inline_sources(
    router: RouterSettings,
    predictor: PredictorSettings,
    timeouts_s: tuple[float, float],
    registry: CollectorRegistry | None = None,
) -> AsyncIterator[tuple[ConfidenceSource, LengthSource]]:
    """The router and predictor served in this process while the context is open.

    ``timeouts_s``: the router's and the predictor's per-call deadlines. ``registry`` (the dispatcher's)
    gets the services' batch and artifact metrics under their own names (``chimera_router_*``...).
    """
    rc = _collector(router, score_batch, "router", router_backends.INLINE_BACKENDS, registry)
    pc = _collector(predictor, predict_batch, "predictor", predictor_backends.INLINE_BACKENDS, registry)
    await rc.start()
    try:
        await pc.start()
        try:
            yield (
                InlineRouter(RouterService(rc, router.max_request_items), timeouts_s[0]),
                InlinePredictor(PredictorService(pc, predictor.max_request_items), timeouts_s[1]),
            )
        finally:
            await pc.close()
    finally:
        await rc.close()
