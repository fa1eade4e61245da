"""The predictor's batch function: runs inside the collector's worker processes, on the loaded backend."""

from __future__ import annotations

from dataclasses import dataclass

from services.predictor.backends import PredictorBackend
from services.predictor.features import PredictorInput


@dataclass(frozen=True, slots=True)
class PredictItem:
    row: PredictorInput
    quantiles: tuple[float, ...]


def predict_batch(backend: PredictorBackend, items: list[PredictItem]) -> list[tuple[float, ...]]:
    """Quantile values per item; items asking for the same quantiles are predicted together."""
    out: list[tuple[float, ...]] = [()] * len(items)
    groups: dict[tuple[float, ...], list[int]] = {}
    for i, it in enumerate(items):
        groups.setdefault(it.quantiles, []).append(i)
    for qs, idx in groups.items():
        values = backend.predict([items[i].row for i in idx], qs)
        for i, row in zip(idx, values, strict=True):
            out[i] = tuple(float(v) for v in row)
    return out
