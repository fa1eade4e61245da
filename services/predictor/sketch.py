"""The predictor's text sketch (paper §2.2, feature 4): TF-IDF of the user prompt on uni- and bi-grams,
reduced with truncated SVD to a few dense columns a tree can split on.

Fitted on the distinct task texts only: a task appears once per stage and per model in the traces, and
counting it several times would only reweight the vocabulary toward the longest workflows.

Serving projects each text through ``TfidfRows`` and the SVD's components directly (the SVD's transform is
the product with its components): scikit-learn's per-call checks cost several times the arithmetic on one
row (services/common/tfidf_rows.py). ``transform_sklearn`` is the reference path.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.decomposition import TruncatedSVD
from sklearn.feature_extraction.text import TfidfVectorizer

from services.common.tfidf_rows import FoldedOnLoad, TfidfRows
from services.predictor.features import Matrix, PredictorInput


class TextSketch(FoldedOnLoad):
    _DERIVED = ("_projection",)

    def __init__(self, components: int = 32, max_features: int = 20_000, seed: int = 0) -> None:
        if components < 1 or max_features < 1:
            raise ValueError("components and max_features must be >= 1")
        self.components = components
        self._vectorizer = TfidfVectorizer(
            ngram_range=(1, 2), min_df=2, max_features=max_features, sublinear_tf=True
        )
        self._svd: TruncatedSVD | None = None
        self._fitted = False
        self._seed = seed
        self._width = components
        # Serving form: the tf-idf rows and the SVD's components transposed ([vocabulary, width]); None
        # without a sketch.
        self._projection: tuple[TfidfRows, Matrix] | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f"sketch_{i}" for i in range(self._width))

    def fit(self, rows: Sequence[PredictorInput]) -> None:
        texts = sorted({r.user_text for r in rows})
        if len(texts) < 4:
            self._vectorizer.set_params(min_df=1)  # a handful of tasks would leave no vocabulary
        self._fitted = True
        self._svd = None
        try:
            tfidf = self._vectorizer.fit_transform(texts)
        except ValueError:  # no token in any text (empty vocabulary): nothing to sketch
            self._width = 0
        else:
            # SVD needs fewer components than either side of the matrix; a degenerate vocabulary gets none.
            self._width = max(0, min(self.components, tfidf.shape[0] - 1, tfidf.shape[1] - 1))
            if self._width:
                self._svd = TruncatedSVD(n_components=self._width, random_state=self._seed)
                self._svd.fit(tfidf)
        self._fold()  # without a sketch too: a refit must not serve the old projection

    def _fold(self) -> None:
        self._projection = None
        if self._svd is not None:
            basis = np.ascontiguousarray(np.asarray(self._svd.components_, dtype=np.float64).T)
            self._projection = (TfidfRows(self._vectorizer), basis)

    def transform(self, rows: Sequence[PredictorInput]) -> Matrix:
        if not self._fitted:
            raise RuntimeError("TextSketch is not fitted")
        if self._projection is None:
            return np.zeros((len(rows), 0), dtype=np.float64)
        tfidf, basis = self._projection
        out = np.empty((len(rows), basis.shape[1]), dtype=np.float64)
        for i, r in enumerate(rows):
            out[i] = tfidf.dot(r.user_text, basis)
        return out

    def transform_sklearn(self, rows: Sequence[PredictorInput]) -> Matrix:
        """``transform`` through scikit-learn's vectorizer and SVD (slower; for checking)."""
        if not self._fitted:
            raise RuntimeError("TextSketch is not fitted")
        if self._svd is None:
            return np.zeros((len(rows), 0), dtype=np.float64)
        out: Matrix = np.asarray(
            self._svd.transform(self._vectorizer.transform([r.user_text for r in rows])), dtype=np.float64
        )
        return out
