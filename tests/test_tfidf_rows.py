"""The serving paths that bypass scikit-learn's per-call machinery give scikit-learn's answers.

``TfidfRows`` against ``TfidfVectorizer.transform``, the tf-idf router's folded heads against its
scikit-learn heads, and the predictor's text sketch against its vectorizer and SVD: on the embedded corpus's
real task texts, on texts with no known term, and after a pickle round trip (artifacts drop the derived
serving form and rebuild it on load).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from sklearn.feature_extraction.text import TfidfVectorizer

from services.common.tfidf_rows import TfidfRows, Unsupported
from services.predictor.features import PredictorInput
from services.predictor.sketch import TextSketch
from services.router.tfidf import TfidfRouter
from services.workload.corpus import embedded_corpus
from tests.test_learned_router import MODELS, fake_problems, fake_traces

pytestmark = pytest.mark.unit

ODD = ["", "   ", "zzzz qqqq xxxx", "the the the the", "Ünïcödé 中文 ∑ x_1 + y_2 = 42!!"]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [p.text for p in embedded_corpus().problems] + [p.text for p in fake_problems()] + ODD


@pytest.mark.parametrize("sublinear", [True, False])
@pytest.mark.parametrize("norm", ["l2", None])
def test_rows_equal_sklearn_transform(texts: list[str], sublinear: bool, norm: str | None) -> None:
    vec = TfidfVectorizer(ngram_range=(1, 2), min_df=1, sublinear_tf=sublinear, norm=norm)
    vec.fit(texts[: len(texts) // 2])  # the rest holds terms the vocabulary has never seen
    fast = TfidfRows(vec)
    want = vec.transform(texts)
    for i, text in enumerate(texts):
        row = fast.row(text)
        ref = want.getrow(i)
        ref.sort_indices()
        assert row.columns.tolist() == ref.indices.tolist()
        np.testing.assert_allclose(row.weights, ref.data, rtol=1e-12, atol=1e-15)


def test_unsupported_options_are_refused() -> None:
    vec = TfidfVectorizer(norm="l1").fit(["ab cd", "cd ef"])
    with pytest.raises(Unsupported):
        TfidfRows(vec)


def test_router_folded_heads_equal_sklearn_heads(texts: list[str]) -> None:
    traces, outcomes = fake_traces()
    router = TfidfRouter()
    router.fit(traces, outcomes)
    workflows = [("code", "math", "never-seen")[i % 3] for i in range(len(texts))]
    want = router.predict_proba_sklearn(texts, workflows)
    np.testing.assert_allclose(router.predict_proba(texts, workflows), want, rtol=1e-12, atol=1e-15)
    saved = pickle.dumps(router)
    assert b"TfidfRows" not in saved  # artifacts keep the fitted parts only
    loaded = pickle.loads(saved)
    np.testing.assert_allclose(loaded.predict_proba(texts, workflows), want, rtol=1e-12, atol=1e-15)
    assert len(router.models) == len(MODELS)


def test_sketch_projection_equals_vectorizer_and_svd(texts: list[str]) -> None:
    rows = [PredictorInput("m", "code", 0, "", t, t) for t in texts]
    sketch = TextSketch(components=8)
    sketch.fit(rows[: len(rows) // 2])
    want = sketch.transform_sklearn(rows)
    assert want.shape == (len(rows), 8)
    np.testing.assert_allclose(sketch.transform(rows), want, rtol=1e-10, atol=1e-12)
    loaded = pickle.loads(pickle.dumps(sketch))
    np.testing.assert_allclose(loaded.transform(rows), want, rtol=1e-10, atol=1e-12)


def test_sketch_without_vocabulary_has_no_columns(texts: list[str]) -> None:
    rows = [PredictorInput("m", "code", 0, "", "!!!", "!!!")] * 3
    sketch = TextSketch(components=4)
    sketch.fit(rows)
    assert sketch.transform(rows).shape == (3, 0)
    # A refit that ends without a sketch drops the projection of the fit before it.
    sketch.fit([PredictorInput("m", "code", 0, "", t, t) for t in texts[:40]])
    assert sketch.transform(rows).shape == (3, 4)
    sketch.fit(rows)
    assert sketch.transform(rows).shape == (3, 0)
