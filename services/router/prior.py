"""The baseline router: each model's prior success rate, per workflow type, shrunk toward its global rate.

It ignores the task text, so it is the floor every learned router must beat: its ranking of models is the
same for every task of a workflow type.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from services.common.types import OutcomeRow, TraceRow
from services.router.backends import router_examples


class PriorRouter:
    """q[m] = (successes(w, m) + k * rate(m)) / (n(w, m) + k), rate(m) itself shrunk toward the pool mean.

    ``shrinkage`` (k) is the number of pseudo-observations of the global rate: with few traces of a workflow
    the estimate stays near the model's overall rate instead of jumping to 0 or 1.
    """

    name = "prior"

    def __init__(self, shrinkage: float = 10.0, per_workflow: bool = True) -> None:
        if shrinkage < 0:
            raise ValueError("shrinkage must be >= 0")
        self.shrinkage = shrinkage
        self.per_workflow = per_workflow
        self._models: tuple[str, ...] = ()
        self._global: dict[str, float] = {}
        self._by_workflow: dict[str, dict[str, float]] = {}

    @property
    def models(self) -> tuple[str, ...]:
        return self._models

    def fit(self, traces: Sequence[TraceRow], outcomes: Sequence[OutcomeRow]) -> None:
        examples = router_examples(traces, outcomes)
        if not examples:
            raise ValueError("no outcome could be joined with a trace: nothing to learn from")
        k = self.shrinkage
        pool_mean = float(np.mean([e.outcome for e in examples]))
        sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        wsums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
        for e in examples:
            sums[e.model][0] += e.outcome
            sums[e.model][1] += 1
            wsums[(e.workflow, e.model)][0] += e.outcome
            wsums[(e.workflow, e.model)][1] += 1
        self._models = tuple(sorted(sums))
        self._global = {m: (s + k * pool_mean) / (n + k) for m, (s, n) in sums.items()}
        self._by_workflow = {}
        if self.per_workflow:
            for (w, m), (s, n) in wsums.items():
                self._by_workflow.setdefault(w, {})[m] = (s + k * self._global[m]) / (n + k)

    def predict_proba(self, texts: Sequence[str], workflows: Sequence[str]) -> npt.NDArray[np.float64]:
        if len(texts) != len(workflows):
            raise ValueError("texts and workflows must have the same length")
        out = np.empty((len(texts), len(self._models)), dtype=np.float64)
        base = np.array([self._global[m] for m in self._models], dtype=np.float64)
        for i, w in enumerate(workflows):
            per = self._by_workflow.get(w)
            out[i] = base if per is None else [per.get(m, self._global[m]) for m in self._models]
        return np.clip(out, 0.0, 1.0)
