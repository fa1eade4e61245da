"""The paper's length predictor: quantile regression forests, one per model (paper §2.2, App. A.2).

Features (paper §2.2): token counts of the system prompt, the user prompt and the full input; workflow type
and stage; model identity; a TF-IDF + truncated-SVD sketch of the user prompt. The model column is constant
inside one model's forest; it is kept so every forest sees the paper's feature list and a future pooled
forest needs no new featurization.

NOTE(log-target): the forests are fitted on log1p(tokens). Split quality is measured by squared error, and
on raw heavy-tailed totals (a runaway stage emits 30k tokens next to a typical 300) a few outliers would
decide every split. A quantile of log1p(y) maps back to the same quantile of y, since the map is monotone,
so nothing is lost at prediction time.

NOTE(n_jobs): training may use several cores, but the forests are switched to ``n_jobs=1`` before they are
returned or saved: with more, every predict call pays tens of milliseconds of thread start-up, far more
than a one-row prediction costs (offline-assets.md §4). Serving then goes through a flattened copy of each
forest (``flatforest.py``) that gives the same quantiles several times faster; the fitted forests stay in
the artifact so either path can be checked against the other.

NOTE(loops): a stage of an open agent loop (``PredictorInput.loop`` set) is predicted by ``loops``, the
forest of ``services.predictor.loops``, when the artifact has one for its model; every other row, and a
loop on a model no recorded loop ran on, by the workflow forests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from quantile_forest import RandomForestQuantileRegressor

from services.common.tracestore import remaining_tokens
from services.common.types import TraceRow
from services.predictor.features import CategoryFeatures, ConcatFeatures, CountFeatures, PredictorInput
from services.predictor.flatforest import FlatForest
from services.predictor.loops import LoopForest
from services.predictor.sketch import TextSketch

MIN_ROWS_PER_MODEL = 2


class QrfPredictor:
    name = "qrf"

    def __init__(
        self,
        n_estimators: int = 50,
        min_samples_leaf: int = 10,
        max_features: float = 0.5,
        max_samples_leaf: int | None = 1,
        sketch_components: int = 32,
        fit_jobs: int = 1,
        seed: int = 0,
    ) -> None:
        if n_estimators < 1 or min_samples_leaf < 1 or not 0.0 < max_features <= 1.0 or fit_jobs == 0:
            raise ValueError("n_estimators, min_samples_leaf >= 1; 0 < max_features <= 1; fit_jobs != 0")
        self.n_estimators = n_estimators
        self.min_samples_leaf = min_samples_leaf
        self.max_features = max_features
        self.max_samples_leaf = max_samples_leaf
        self.fit_jobs = fit_jobs
        self.seed = seed
        self.features = ConcatFeatures(
            [CountFeatures(), CategoryFeatures(), TextSketch(components=sketch_components, seed=seed)]
        )
        self._forests: dict[str, RandomForestQuantileRegressor] = {}
        self._flat: dict[str, FlatForest] = {}
        self.loops: LoopForest | None = None  # set by training when recorded loops are given

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(sorted(set(self._forests) | set(self.loops.models if self.loops else ())))

    def fit(self, rows: Sequence[TraceRow]) -> None:
        if not rows:
            raise ValueError("no trace rows to learn from")
        target = np.log1p(np.asarray(remaining_tokens(rows), dtype=np.float64))
        inputs = [PredictorInput.from_trace(r) for r in rows]
        self.features.fit(inputs)
        x = self.features.transform(inputs)
        model_of = np.array([r.model for r in rows])
        forests: dict[str, RandomForestQuantileRegressor] = {}
        for m in sorted(set(model_of.tolist())):
            idx = np.flatnonzero(model_of == m)
            if len(idx) < MIN_ROWS_PER_MODEL:
                continue
            forest = RandomForestQuantileRegressor(
                n_estimators=self.n_estimators,
                min_samples_leaf=self.min_samples_leaf,
                max_features=self.max_features,
                max_samples_leaf=self.max_samples_leaf,
                random_state=self.seed,
                n_jobs=self.fit_jobs,
            )
            forest.fit(x[idx], target[idx])
            forest.set_params(n_jobs=1)
            forests[m] = forest
        if not forests:
            raise ValueError(f"no model has {MIN_ROWS_PER_MODEL} or more trace rows")
        self._forests = forests
        # Only one-sample leaves flatten (see flatforest.py); other settings serve through the forests.
        flat = self.max_samples_leaf == 1
        self._flat = {m: FlatForest.from_quantile_forest(f) for m, f in forests.items()} if flat else {}

    def predict(self, rows: Sequence[PredictorInput], quantiles: Sequence[float]) -> npt.NDArray[np.float64]:
        return self._predict(rows, quantiles, flat=bool(self._flat))

    def predict_with_forests(
        self, rows: Sequence[PredictorInput], quantiles: Sequence[float]
    ) -> npt.NDArray[np.float64]:
        """The same as ``predict`` through quantile-forest's own ``predict`` (slower; for checking)."""
        return self._predict(rows, quantiles, flat=False)

    def _predict(
        self, rows: Sequence[PredictorInput], quantiles: Sequence[float], flat: bool
    ) -> npt.NDArray[np.float64]:
        qs = [float(q) for q in quantiles]
        out = np.empty((len(rows), len(qs)), dtype=np.float64)
        if not rows:
            return out
        loops = self.loops
        if loops is not None:
            # NOTE(loops): the loop rows by their index, predicted apart; the rest goes on below.
            states = {i: r.loop for i, r in enumerate(rows) if r.loop is not None and r.model in loops.models}
            if states:
                at = list(states)
                out[at] = loops.predict(list(states.values()), [rows[i].model for i in at], qs)
                rest = [i for i in range(len(rows)) if i not in states]
                if rest:
                    out[rest] = self._predict([rows[i] for i in rest], qs, flat)
                return out
        unknown = sorted({r.model for r in rows} - set(self._forests))
        if unknown:
            raise KeyError(f"no forest for model(s) {unknown}")
        x = self.features.transform(rows)
        model_of = np.array([r.model for r in rows])
        for m in sorted(set(model_of.tolist())):
            idx = np.flatnonzero(model_of == m)
            if flat:
                pred = self._flat[m].predict(x[idx], qs)
            else:
                pred = np.asarray(self._forests[m].predict(x[idx], quantiles=qs), dtype=np.float64)
            out[idx] = pred.reshape(len(idx), len(qs))
        # Quantiles come back per column; a later column never falls below an earlier one for sorted input,
        # but callers may ask in any order, and rounding in expm1 must not break monotonicity either.
        order = np.argsort(qs, kind="stable")
        out[:, order] = np.maximum.accumulate(out[:, order], axis=1)
        result: npt.NDArray[np.float64] = np.maximum(np.expm1(out), 0.0)
        return result

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Whatever saved this artifact, serve with one thread per forest (see NOTE(n_jobs)).
        self.__dict__.update({"loops": None, **state})  # an artifact saved before loops had none
        for forest in self._forests.values():
            forest.set_params(n_jobs=1)
