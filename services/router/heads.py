"""Pieces the learned routers share: the label rule, the workflow encoding, and per-model linear heads.

NOTE(labels): a (task, model) pair is labelled 1 when the workflow succeeded (score >= 0.5, the task-correct
label of paper §2.1; partial credit stays below 0.5 in the outcome model), else 0. Each model gets its own
logistic head over the same features, i.e. one independent sigmoid per model (not a softmax). Fitting the
heads one model at a time on that model's own examples is exactly one-vs-rest when every task ran on every
model, and still correct when traces cover the models unevenly (live traces: one model per workflow).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
from sklearn.linear_model import LogisticRegression

from services.router.backends import RouterExample

F64 = npt.NDArray[np.float64]
Features: TypeAlias = Any  # a dense array or a scipy sparse matrix, one row per example

SUCCESS_THRESHOLD = 0.5


def success(examples: Sequence[RouterExample]) -> npt.NDArray[np.int8]:
    return np.array([e.outcome >= SUCCESS_THRESHOLD for e in examples], dtype=np.int8)


def router_input(text: str, workflow: str) -> str:
    """The text a sequence encoder reads: the workflow type travels with the task, as a prefix."""
    return f"[{workflow}] {text}"


class WorkflowEncoder:
    """One-hot workflow type (unseen types encode as all zeros), so a head can learn each type's offset."""

    def __init__(self, weight: float = 1.0) -> None:
        self.weight = weight
        self._index: dict[str, int] = {}

    def fit(self, workflows: Sequence[str]) -> None:
        self._index = {w: i for i, w in enumerate(sorted(set(workflows)))}

    @property
    def width(self) -> int:
        return len(self._index)

    def columns(self) -> dict[str, int]:
        """Each workflow type seen at fit time and the column it sets to ``weight``."""
        return dict(self._index)

    def transform(self, workflows: Sequence[str]) -> F64:
        out = np.zeros((len(workflows), len(self._index)), dtype=np.float64)
        for i, w in enumerate(workflows):
            j = self._index.get(w)
            if j is not None:
                out[i, j] = self.weight
        return out


class LinearHeads:
    """One logistic regression per model over shared features; a model seen with one class only keeps its
    observed rate as a constant (a head cannot be fitted, and 0 or 1 would be overconfident)."""

    def __init__(self, c: float = 1.0, max_iter: int = 1000) -> None:
        self.c = c
        self.max_iter = max_iter
        self.models: tuple[str, ...] = ()
        self._heads: dict[str, LogisticRegression | float] = {}

    def fit(self, x: Features, examples: Sequence[RouterExample]) -> None:
        """``x`` has one row per example, aligned with ``examples``."""
        labels = success(examples)
        model_of = np.array([e.model for e in examples])
        self.models = tuple(sorted(set(model_of.tolist())))
        self._heads = {}
        for m in self.models:
            idx = np.flatnonzero(model_of == m)
            y = labels[idx]
            if y.min() == y.max():
                n = len(y)
                self._heads[m] = (float(y.sum()) + 0.5) / (n + 1.0)
                continue
            head = LogisticRegression(C=self.c, solver="liblinear", max_iter=self.max_iter, random_state=0)
            head.fit(x[idx], y)
            self._heads[m] = head
        if not self.models:
            raise ValueError("no examples to fit the router heads on")

    def linear_form(self, width: int) -> tuple[F64, F64, F64]:
        """The heads as one affine map over ``width`` features: (coef [width, models], intercept [models],
        constant [models]: a fixed probability, or NaN where the head is a fitted regression).

        ``expit(x @ coef + intercept)`` is ``predict_proba(x)`` wherever ``constant`` is NaN: a binary
        logistic regression's probability of class 1 is the sigmoid of its decision function.
        """
        coef = np.zeros((width, len(self.models)), dtype=np.float64)
        intercept = np.zeros(len(self.models), dtype=np.float64)
        constant = np.full(len(self.models), np.nan, dtype=np.float64)
        for j, m in enumerate(self.models):
            head = self._heads[m]
            if isinstance(head, float):
                constant[j] = head
            else:
                if list(head.classes_) != [0, 1] or head.coef_.shape != (1, width):
                    raise ValueError(f"head {m!r} is not a binary regression over {width} features")
                coef[:, j] = head.coef_[0]
                intercept[j] = head.intercept_[0]
        return coef, intercept, constant

    def predict_proba(self, x: Features) -> F64:
        n = x.shape[0]
        out = np.empty((n, len(self.models)), dtype=np.float64)
        for j, m in enumerate(self.models):
            head = self._heads[m]
            if isinstance(head, float):
                out[:, j] = head
            else:
                out[:, j] = head.predict_proba(x)[:, 1]
        return out
