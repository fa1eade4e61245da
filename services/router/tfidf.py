"""The fast CPU router: TF-IDF of the task text (uni- and bi-grams) plus the workflow type, one logistic
sigmoid per model (paper §2.1's multi-label head on a bag-of-n-grams instead of ModernBERT).

Fits in seconds on thousands of tasks and scores a batch of 32 in a few milliseconds, so it is the default
backend; ``minilm`` and ``modernbert`` trade that speed for an encoder. The task's log length (centred) is one
more column: longer statements are harder, and a bag of n-grams normalised to unit length cannot see length.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from scipy import sparse
from sklearn.feature_extraction.text import TfidfVectorizer

from services.common.tokens import approx_tokens
from services.common.types import OutcomeRow, TraceRow
from services.router.backends import router_examples
from services.router.heads import LinearHeads, WorkflowEncoder


class TfidfRouter:
    name = "tfidf"

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

    def predict_proba(self, texts: Sequence[str], workflows: Sequence[str]) -> npt.NDArray[np.float64]:
        if len(texts) != len(workflows):
            raise ValueError("texts and workflows must have the same length")
        return self._heads.predict_proba(self._features(texts, workflows))
