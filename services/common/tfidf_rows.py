"""A fitted TF-IDF vectorizer applied to one text at a time, without scikit-learn's per-call machinery.

NOTE(speed): scikit-learn's ``transform`` and ``predict_proba`` on a single text spend almost all their time
in input validation (``check_array``, dataframe detection through ``inspect``) and sparse-matrix construction
around a few dozen dictionary lookups: a one-text tf-idf router score took 0.87-1.0 ms CPU, 0.06 ms through
this path (measured in-process on the bootstrap artifacts). The router and the predictor's text sketch run
once per first stage, so that was most of each model's serving cost. ``TfidfRows`` keeps what the fitted
vectorizer learned (its analyzer, vocabulary and idf weights) and computes the same row with the same float64
operations in the same order: counts of in-vocabulary terms by ascending column, then ``log(tf) + 1`` when
sublinear, times idf, then the row scaled to unit L2 norm. ``test_tfidf_rows.py`` checks it against
``transform`` on the shipped corpus.

Only what Chimera's vectorizers use is reproduced (word analyzers, ``norm`` of "l2" or None, float64); a
vectorizer with other options raises ``Unsupported`` when the artifact loads, rather than serving numbers
that differ from the ones it was trained to give.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]


class Unsupported(ValueError):
    """The vectorizer uses an option this fast path does not reproduce."""


@dataclass(frozen=True, slots=True)
class SparseRow:
    """One document's TF-IDF row: column ids in ascending order and their weights."""

    columns: IntArray
    weights: F64


class TfidfRows:
    """``row(text)`` equals ``vectorizer.transform([text])`` as a (columns, weights) pair."""

    def __init__(self, vectorizer: Any) -> None:
        """``vectorizer``: a fitted ``sklearn.feature_extraction.text.TfidfVectorizer``."""
        if vectorizer.norm not in ("l2", None) or vectorizer.binary or vectorizer.dtype is not np.float64:
            raise Unsupported("only norm='l2' or None, binary=False and float64 are reproduced")
        self._analyze: Callable[[str], list[str]] = vectorizer.build_analyzer()
        self._vocab: dict[str, int] = dict(vectorizer.vocabulary_)
        self._idf: F64 | None = np.asarray(vectorizer.idf_, dtype=np.float64) if vectorizer.use_idf else None
        self._sublinear = bool(vectorizer.sublinear_tf)
        self._l2 = vectorizer.norm == "l2"

    def row(self, text: str) -> SparseRow:
        counts: dict[int, int] = {}
        vocab = self._vocab
        for term in self._analyze(text):
            j = vocab.get(term)
            if j is not None:
                counts[j] = counts.get(j, 0) + 1
        columns = np.fromiter(sorted(counts), dtype=np.intp, count=len(counts))
        weights = np.fromiter((counts[j] for j in columns), dtype=np.float64, count=len(counts))
        if self._sublinear:
            weights = np.log(weights) + 1.0
        if self._idf is not None:
            weights *= self._idf[columns]
        if self._l2 and len(weights):
            norm = float(np.sqrt(np.dot(weights, weights)))
            if norm > 0.0:
                weights /= norm
        return SparseRow(columns, weights)

    def dot(self, text: str, matrix: F64) -> F64:
        """``transform([text]) @ matrix`` for a dense ``matrix`` of shape [vocabulary, k]: shape [k]."""
        r = self.row(text)
        out: F64 = r.weights @ matrix[r.columns] if len(r.columns) else np.zeros(matrix.shape[1])
        return out


class FoldedOnLoad(abc.ABC):
    """A fitted model whose serving form (the attributes named in ``_DERIVED``) ``_fold`` derives from its
    fitted parts: pickles (artifacts) leave it out, and unpickling rebuilds it, so artifacts saved before the
    serving form existed serve through it too."""

    _DERIVED: tuple[str, ...] = ()

    @abc.abstractmethod
    def _fold(self) -> None:
        """Derive the serving form from the fitted parts (after fitting, and on unpickling)."""

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in self._DERIVED}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._fold()
