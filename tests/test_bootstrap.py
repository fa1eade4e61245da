"""The first router and predictor of a pool: trained on the committed real traces for the models they cover,
on synthetic stand-ins for the rest, and replaced when a bootstrap was trained on less than there is now."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common import artifacts
from services.common.tracestore import read_trace_folder
from services.launcher.bootstrap import ensure_artifacts, read_provenance
from services.launcher.config import REAL_TRACES
from services.launcher.pool import EngineSpec, PoolSpec
from services.router.training import train_router

pytestmark = pytest.mark.unit

SMOLLM2 = EngineSpec(id="smollm2", model="SmolLM2-135M-Instruct", stand_in="qwen2.5-1.5b")
CODER = EngineSpec(id="coder-0_5b", model="Qwen2.5-Coder-0.5B-Instruct", stand_in="qwen2.5-7b")
UNSEEN = EngineSpec(id="big", model="Some-Unseen-Model", stand_in="qwen2.5-14b")


def _bootstrap(pool: PoolSpec, root: Path, real: Path | None) -> None:
    ensure_artifacts(pool, root, workflows=100, seed=0, embedded=True, real_folder=real)


def test_a_pool_the_real_traces_cover_learns_from_them_alone(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    _bootstrap(PoolSpec(engines=(SMOLLM2, CODER)), root, REAL_TRACES)
    made = read_provenance(root)
    assert made is not None and made.synthetic == ()
    _, outcomes = read_trace_folder(REAL_TRACES)
    for model in (SMOLLM2.model, CODER.model):
        assert made.real[model] == sum(o.model == model for o in outcomes) > 0
    meta = artifacts.load_meta(root / "router", made.router)
    assert set(meta.models) == {SMOLLM2.model, CODER.model}
    # Trained on the real rows only: as many as the folder holds for these two models.
    assert meta.rows == sum(made.real.values())


def test_a_model_no_real_trace_covers_gets_the_synthetic_bootstrap(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    _bootstrap(PoolSpec(engines=(CODER, UNSEEN)), root, REAL_TRACES)
    made = read_provenance(root)
    assert made is not None
    assert set(made.real) == {CODER.model} and made.synthetic == (UNSEEN.model,)
    meta = artifacts.load_meta(root / "predictor", made.predictor)
    assert set(meta.models) == {CODER.model, UNSEEN.model}


def test_an_all_synthetic_bootstrap_is_replaced_once_real_traces_cover_the_pool(tmp_path: Path) -> None:
    root, pool = tmp_path / "artifacts", PoolSpec(engines=(SMOLLM2, CODER))
    _bootstrap(pool, root, None)
    first = read_provenance(root)
    assert first is not None and set(first.synthetic) == {SMOLLM2.model, CODER.model}
    _bootstrap(pool, root, None)  # nothing new: kept
    assert read_provenance(root) == first
    _bootstrap(pool, root, REAL_TRACES)
    second = read_provenance(root)
    assert second is not None and second.synthetic == () and second.router != first.router
    assert artifacts.current_version(root / "router") == second.router


def test_a_version_the_operator_trained_is_kept(tmp_path: Path) -> None:
    root, pool = tmp_path / "artifacts", PoolSpec(engines=(SMOLLM2, CODER))
    _bootstrap(pool, root, None)
    traces, outcomes = read_trace_folder(REAL_TRACES)
    mine = train_router(traces, outcomes, root)  # as `chimera train` would: it becomes current
    _bootstrap(pool, root, REAL_TRACES)
    assert artifacts.current_version(root / "router") == mine.version
