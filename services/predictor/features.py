"""Predictor featurization: the same code turns recorded traces and live requests into features.

The predictor receives raw text, never token counts (see the proto), so training and serving cannot drift
apart. Extractors share one small protocol (``fit`` on training rows, ``transform`` to a float matrix), and
``ConcatFeatures`` stacks them: the empirical baseline needs only the categorical keys, while a quantile
regression forest uses ``ConcatFeatures([CountFeatures(), CategoryFeatures(), <a TF-IDF+SVD sketch>])``
(paper §2.2: token counts, workflow and stage ids, model identity, text sketch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from services.common.tokens import approx_tokens
from services.common.types import LoopState, TraceRow

Matrix = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class PredictorInput:
    """One stage request as the predictor sees it (the proto's FeatureRow)."""

    model: str
    workflow: str
    stage: int
    system_text: str
    user_text: str
    prompt_text: str
    loop: LoopState | None = None  # an open agent loop's state (services.predictor.loops)

    @staticmethod
    def from_trace(t: TraceRow) -> PredictorInput:
        return PredictorInput(t.model, t.workflow, t.stage, t.system_text, t.user_text, t.prompt_text)


class FeatureExtractor(Protocol):
    """Stateless or fitted-once featurization; must be picklable (it is saved inside the artifact)."""

    @property
    def names(self) -> tuple[str, ...]: ...

    def fit(self, rows: Sequence[PredictorInput]) -> None: ...

    def transform(self, rows: Sequence[PredictorInput]) -> Matrix: ...


class CountFeatures:
    """Approximate token counts of the system text, the task text and the whole stage input."""

    names = ("system_tokens", "user_tokens", "prompt_tokens")

    def fit(self, rows: Sequence[PredictorInput]) -> None:
        return None

    def transform(self, rows: Sequence[PredictorInput]) -> Matrix:
        out = np.empty((len(rows), 3), dtype=np.float64)
        for i, r in enumerate(rows):
            out[i] = (approx_tokens(r.system_text), approx_tokens(r.user_text), approx_tokens(r.prompt_text))
        return out


class CategoryFeatures:
    """Ordinal codes of model, workflow and stage, learned at fit time; unseen values encode as -1.

    Trees split ordinal codes well enough for a handful of categories, and -1 keeps unseen values apart.
    """

    names = ("model_id", "workflow_id", "stage")

    def __init__(self) -> None:
        self._models: dict[str, int] = {}
        self._workflows: dict[str, int] = {}

    def fit(self, rows: Sequence[PredictorInput]) -> None:
        self._models = {m: i for i, m in enumerate(sorted({r.model for r in rows}))}
        self._workflows = {w: i for i, w in enumerate(sorted({r.workflow for r in rows}))}

    def transform(self, rows: Sequence[PredictorInput]) -> Matrix:
        out = np.empty((len(rows), 3), dtype=np.float64)
        for i, r in enumerate(rows):
            out[i] = (self._models.get(r.model, -1), self._workflows.get(r.workflow, -1), r.stage)
        return out


class ConcatFeatures:
    """Column-wise concatenation of several extractors, in order."""

    def __init__(self, parts: Sequence[FeatureExtractor]) -> None:
        self.parts = tuple(parts)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for p in self.parts for n in p.names)

    def fit(self, rows: Sequence[PredictorInput]) -> None:
        for p in self.parts:
            p.fit(rows)

    def transform(self, rows: Sequence[PredictorInput]) -> Matrix:
        if not self.parts:
            return np.empty((len(rows), 0), dtype=np.float64)
        return np.hstack([p.transform(rows) for p in self.parts])
