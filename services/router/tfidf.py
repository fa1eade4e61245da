"""The fast CPU router: TF-IDF of the task text (uni- and bi-grams) plus the workflow type, one logistic
sigmoid per model (paper §2.1's multi-label head on a bag-of-n-grams instead of ModernBERT).

Fits in seconds on thousands of tasks and scores a batch of 32 in a few milliseconds, so it is the default
backend; ``minilm`` and ``modernbert`` trade that speed for an encoder. The task's log length (centred) is one
more column: longer statements are harder, and a bag of n-grams normalised to unit length cannot see length.

NOTE(serving): scoring goes through ``_Affine``, the fitted features and heads folded into one affine map per
model, fed by ``TfidfRows`` (services/common/tfidf_rows.py): the same probabilities as the scikit-learn path
(``predict_proba_sklearn``, kept for checking) at a small fraction of its per-call cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import sparse
from scipy.special import expit
from sklearn.feature_extraction.text import TfidfVectorizer

from services.common.tfidf_rows import FoldedOnLoad, TfidfRows
from services.common.tokens import approx_tokens
from services.common.types import OutcomeRow, TraceRow
from services.router.backends import router_examples
from services.router.heads import LinearHeads, WorkflowEncoder

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class _Affine:
    """The fitted router as ``expit(features @ coef + intercept)`` per model, split by feature block."""

    rows: TfidfRows
    text: F64  # [vocabulary, models]
    workflow: F64  # [workflow types, models], already times the encoder's weight
    length: F64  # [models]: the coefficient of the centred log length
    intercept: F64
    constant: F64  # [models]: a head's fixed probability, NaN for a fitted head
    fitted: npt.NDArray[np.bool_]  # [models]: isnan(constant), once rather than per score
    length_centre: float
    columns: dict[str, int]

    def score(self, text: str, workflow: str) -> F64:
        z = self.rows.dot(text, self.text) + self.intercept
        j = self.columns.get(workflow)
        if j is not None:
            z += self.workflow[j]
        z += self.length * (float(np.log1p(approx_tokens(text))) - self.length_centre)
        p: F64 = expit(z)
        return np.where(self.fitted, p, self.constant)


class TfidfRouter(FoldedOnLoad):
    name = "tfidf"
    _DERIVED = ("_affine",)

    def __init__(self, max_features: int = 50_000, min_df: int = 2, c: float = 1.0) -> None:
        if max_features < 1 or min_df < 1 or c <= 0:
            raise ValueError("max_features and min_df must be >= 1 and c > 0")
        self.max_features = max_features
        self.min_df = min_df
        self._vectorizer = TfidfVectorizer(
            ngram_range=(1, 2), min_df=min_df, max_features=max_features, sublinear_tf=True
        )
        self._workflows = WorkflowEncoder()
        self._heads = LinearHeads(c=c)
        self._length_centre = 0.0

    @property
    def models(self) -> tuple[str, ...]:
        return self._heads.models

    @staticmethod
    def _log_length(texts: Sequence[str]) -> npt.NDArray[np.float64]:
        return np.log1p(np.array([approx_tokens(t) for t in texts], dtype=np.float64))

    def _features(self, texts: Sequence[str], workflows: Sequence[str]) -> sparse.csr_matrix:
        length = (self._log_length(texts) - self._length_centre)[:, None]
        dense = np.hstack([self._workflows.transform(workflows), length])
        return sparse.hstack([self._vectorizer.transform(texts), sparse.csr_matrix(dense)], format="csr")

    def fit(self, traces: Sequence[TraceRow], outcomes: Sequence[OutcomeRow]) -> None:
        examples = router_examples(traces, outcomes)
        if not examples:
            raise ValueError("no outcome could be joined with a trace: nothing to learn from")
        # Each task usually appears once per model: vectorize the distinct ones and index into them.
        keys = sorted({(e.text, e.workflow) for e in examples})
        if len({t for t, _ in keys}) < 2 * self.min_df:
            self._vectorizer.set_params(min_df=1)  # a tiny trace set would leave no vocabulary at all
        self._vectorizer.fit([t for t, _ in keys])
        self._workflows.fit([w for _, w in keys])
        self._length_centre = float(np.mean(self._log_length([t for t, _ in keys])))
        row = {k: i for i, k in enumerate(keys)}
        x = self._features([t for t, _ in keys], [w for _, w in keys])
        self._heads.fit(x[[row[(e.text, e.workflow)] for e in examples]], examples)
        self._fold()

    def _fold(self) -> None:
        vocab = len(self._vectorizer.vocabulary_)
        wf = self._workflows
        coef, intercept, constant = self._heads.linear_form(vocab + wf.width + 1)
        self._affine = _Affine(
            rows=TfidfRows(self._vectorizer),
            text=np.ascontiguousarray(coef[:vocab]),
            workflow=coef[vocab : vocab + wf.width] * wf.weight,
            length=coef[vocab + wf.width],
            intercept=intercept,
            constant=constant,
            fitted=np.isnan(constant),
            length_centre=self._length_centre,
            columns=wf.columns(),
        )

    def predict_proba(self, texts: Sequence[str], workflows: Sequence[str]) -> F64:
        if len(texts) != len(workflows):
            raise ValueError("texts and workflows must have the same length")
        out = np.empty((len(texts), len(self.models)), dtype=np.float64)
        for i, (text, workflow) in enumerate(zip(texts, workflows, strict=True)):
            out[i] = self._affine.score(text, workflow)
        return out

    def predict_proba_sklearn(self, texts: Sequence[str], workflows: Sequence[str]) -> F64:
        """``predict_proba`` through scikit-learn's transform and heads (slower; for checking)."""
        return self._heads.predict_proba(self._features(texts, workflows))
