"""The predictor's request logic between the gRPC edge and the batch collector."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from services.common.artifacts import ArtifactMeta
from services.common.batching import BatchCollector, NoArtifactError
from services.predictor.errors import BadRequestError, TooManyRowsError, UnknownModelError
from services.predictor.features import PredictorInput
from services.predictor.inference import PredictItem

PredictorCollector = BatchCollector[PredictItem, tuple[float, ...]]
DEFAULT_QUANTILES = (0.5, 0.9)


@dataclass(frozen=True, slots=True)
class Predictions:
    values: tuple[tuple[float, ...], ...]  # aligned with the request's rows; each aligned with quantiles
    quantiles: tuple[float, ...]
    version: str


class PredictorService:
    def __init__(self, collector: PredictorCollector, max_request_items: int) -> None:
        self._collector = collector
        self._max_items = max_request_items

    def describe(self) -> ArtifactMeta:
        meta = self._collector.current
        if meta is None:
            raise NoArtifactError("no predictor artifact loaded yet")
        return meta

    async def predict(self, rows: Sequence[PredictorInput], quantiles: Sequence[float]) -> Predictions:
        """Quantiles of total remaining output tokens per row; ``quantiles`` empty means (0.5, 0.9)."""
        if not rows:
            raise BadRequestError("rows is empty")
        if len(rows) > self._max_items:
            raise TooManyRowsError(f"{len(rows)} rows exceed the limit of {self._max_items} per call")
        qs = tuple(float(q) for q in quantiles) or DEFAULT_QUANTILES
        bad = [q for q in qs if not (math.isfinite(q) and 0.0 < q < 1.0)]
        if bad:
            raise BadRequestError(f"quantiles must lie strictly between 0 and 1, got {bad}")
        known = set(self.describe().models)
        unknown = sorted({r.model for r in rows} - known)
        if unknown:
            raise UnknownModelError(f"unknown model(s) {unknown}; the predictor knows {sorted(known)}")
        answer = await self._collector.submit_many([PredictItem(r, qs) for r in rows])
        return Predictions(answer.results, qs, answer.version)
