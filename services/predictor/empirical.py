"""The baseline predictor: empirical quantiles of remaining tokens per (model, workflow, stage).

NOTE(fallback): a key is used only when it has at least ``min_count`` training rows; otherwise the lookup
falls back to (model, workflow), then (model), then every row. Each key keeps its distribution as a fixed grid
of quantiles (``grid`` points from 0 to 1), so the artifact stays small however many traces it saw, and any
requested quantile is a linear interpolation on that grid.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from services.common.tracestore import remaining_tokens
from services.common.types import TraceRow
from services.predictor.features import PredictorInput

Key = tuple[str, ...]


class EmpiricalPredictor:
    name = "empirical"

    def __init__(self, min_count: int = 5, grid: int = 101) -> None:
        if min_count < 1 or grid < 2:
            raise ValueError("min_count must be >= 1 and grid >= 2")
        self.min_count = min_count
        self._grid = np.linspace(0.0, 1.0, grid)
        self._tables: dict[Key, npt.NDArray[np.float64]] = {}
        self._models: tuple[str, ...] = ()

    @property
    def models(self) -> tuple[str, ...]:
        return self._models

    @staticmethod
    def _keys(model: str, workflow: str, stage: int) -> tuple[Key, ...]:
        """Lookup order, most specific first."""
        return (("mws", model, workflow, str(stage)), ("mw", model, workflow), ("m", model), ("all",))

    def fit(self, rows: Sequence[TraceRow]) -> None:
        if not rows:
            raise ValueError("no trace rows to learn from")
        targets = remaining_tokens(rows)
        groups: dict[Key, list[int]] = defaultdict(list)
        for r, y in zip(rows, targets, strict=True):
            for key in self._keys(r.model, r.workflow, r.stage):
                groups[key].append(y)
        self._tables = {
            key: np.quantile(np.asarray(ys, dtype=np.float64), self._grid).astype(np.float64)
            for key, ys in groups.items()
            if len(ys) >= self.min_count or key == ("all",)
        }
        self._models = tuple(sorted({r.model for r in rows}))

    def _lookup(self, r: PredictorInput) -> npt.NDArray[np.float64]:
        for key in self._keys(r.model, r.workflow, r.stage):
            table = self._tables.get(key)
            if table is not None:
                return table
        raise RuntimeError("predictor is not fitted")

    def predict(self, rows: Sequence[PredictorInput], quantiles: Sequence[float]) -> npt.NDArray[np.float64]:
        qs = np.asarray(quantiles, dtype=np.float64)
        out = np.empty((len(rows), len(qs)), dtype=np.float64)
        for i, r in enumerate(rows):
            table = next(
                t for k in self._keys(r.model, r.workflow, r.stage) if (t := self._tables.get(k)) is not None
            )
            out[i] = np.interp(qs, self._grid, table)
        return out
