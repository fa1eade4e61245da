"""QRF length predictor: beats FCFS and input length, the flattened forests match quantile-forest exactly,
artifacts round-trip with n_jobs=1, and the predictor server serves it unchanged.

Traces come from the real outcome model (services/workload) on a small, seeded, clearly fake corpus.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import random
from pathlib import Path

import grpc
import numpy as np
import pytest

from chimera.predictor.v1 import predictor_pb2, predictor_pb2_grpc
from services.common import artifacts
from services.common.types import TraceRow
from services.predictor.backends import make_backend
from services.predictor.config import PredictorSettings
from services.predictor.features import PredictorInput
from services.predictor.flatforest import linear_quantiles
from services.predictor.qrf import QrfPredictor
from services.predictor.server import PredictorServer
from services.predictor.training import train_predictor
from services.workload.corpus import Problem
from services.workload.generate import bindings_for, generate
from services.workload.outcome import OutcomeModel

MODELS = ("qwen2.5-1.5b", "qwen2.5-14b")
WORDS = ("sum", "list", "graph", "path", "prime", "modulo", "string", "tree", "integral", "triangle")


def fake_traces(draws: int = 300, seed: int = 2) -> list[TraceRow]:
    """Fake tasks of random words and difficulty, run through the real outcome model on two models."""
    rng = random.Random(5)
    problems = [
        Problem(
            id=f"fake/{i}",
            text=f"Fake task {i}: " + " ".join(rng.choice(WORDS) for _ in range(5 + rng.randrange(60))),
            domain="code" if i % 2 else "math",
            difficulty=rng.random(),
            source="fake",
        )
        for i in range(120)
    ]
    model = OutcomeModel(problems, models=MODELS)
    return [t for p in generate(problems, model, bindings_for(MODELS), draws, seed) for t in p.traces]


@pytest.fixture(scope="module")
def fitted() -> tuple[QrfPredictor, list[TraceRow]]:
    rows = fake_traces()
    q = QrfPredictor(n_estimators=30)
    q.fit(rows)
    return q, rows


@pytest.mark.unit
def test_training_beats_fcfs_and_input_length(tmp_path: Path) -> None:
    meta = train_predictor(fake_traces(), tmp_path, holdout=0.3)  # qrf is the default backend
    m = meta.metrics
    assert meta.backend == "qrf" and set(meta.models) == {
        "Qwen/Qwen2.5-1.5B-Instruct",
        "Qwen/Qwen2.5-14B-Instruct",
    }
    assert m["kendall_tau_distance"] < m["kendall_tau_distance_fcfs"] - 0.1, m
    assert m["kendall_tau_distance"] < m["kendall_tau_distance_input_length"], m
    # Held out by task text (no task on both sides), so each model must beat FCFS on unseen tasks.
    for model, per in m["per_model"].items():
        assert per["kendall_tau_distance"] < per["kendall_tau_distance_fcfs"] - 0.05, (model, per)
        assert per["p90_coverage"] > 0.7, model


@pytest.mark.unit
def test_flat_forests_match_quantile_forest(fitted: tuple[QrfPredictor, list[TraceRow]]) -> None:
    q, rows = fitted
    inputs = [PredictorInput.from_trace(r) for r in rows[:200]]
    for qs in ((0.5, 0.9), (0.1, 0.5, 0.75, 0.99), (0.5,)):
        assert np.array_equal(q.predict(inputs, qs), q.predict_with_forests(inputs, qs)), qs


@pytest.mark.unit
def test_quantiles_are_ordered_positive_and_model_specific(
    fitted: tuple[QrfPredictor, list[TraceRow]],
) -> None:
    q, rows = fitted
    inputs = [PredictorInput.from_trace(r) for r in rows[:50]]
    out = q.predict(inputs, (0.5, 0.9, 0.1))
    assert out.shape == (50, 3) and (out >= 0).all()
    assert (out[:, 2] <= out[:, 0]).all() and (out[:, 0] <= out[:, 1]).all()
    assert q.predict([], (0.5,)).shape == (0, 1)
    swapped = [dataclasses.replace(x, model=inputs[0].model) for x in inputs]
    same_model = [x for x in inputs if x.model == inputs[0].model]
    assert len(same_model) < 50 and not np.array_equal(q.predict(swapped, (0.5,)), out[:, :1])
    with pytest.raises(KeyError):
        q.predict([PredictorInput("gpt-9", "code/coder", 0, "", "x", "x")], (0.5,))


@pytest.mark.unit
def test_artifact_round_trip_serves_with_one_thread(
    tmp_path: Path, fitted: tuple[QrfPredictor, list[TraceRow]]
) -> None:
    q, rows = fitted
    for forest in q._forests.values():  # as if someone saved it configured for all cores
        forest.set_params(n_jobs=-1)
    meta = artifacts.publish(
        tmp_path / "p", q, kind="predictor", backend="qrf", data_hash="x", rows=1, models=q.models
    )
    version, loaded = artifacts.load(tmp_path / "p")
    assert version == meta.version and loaded.models == q.models
    assert all(f.n_jobs == 1 for f in loaded._forests.values())
    inputs = [PredictorInput.from_trace(r) for r in rows[:20]]
    assert np.array_equal(loaded.predict(inputs, (0.5, 0.9)), q.predict(inputs, (0.5, 0.9)))
    assert pickle.loads(pickle.dumps(make_backend("qrf"))).models == ()


@pytest.mark.unit
def test_tiny_traces_still_fit() -> None:
    rows = fake_traces(draws=3)
    q = QrfPredictor(n_estimators=5)
    q.fit(rows)
    assert q.predict([PredictorInput.from_trace(rows[0])], (0.5,)).shape == (1, 1)
    with pytest.raises(ValueError):
        QrfPredictor().fit([])


async def test_predictor_server_serves_qrf_unchanged(
    tmp_path: Path, fitted: tuple[QrfPredictor, list[TraceRow]]
) -> None:
    q, rows = fitted
    meta = artifacts.publish(
        tmp_path / "predictor", q, kind="predictor", backend="qrf", data_hash="x", rows=1, models=q.models
    )
    settings = PredictorSettings(port=0, artifact_dir=tmp_path / "predictor", grace_s=1.0, max_wait_ms=1.0)
    server = PredictorServer(settings)
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = predictor_pb2_grpc.PredictorStub(channel)
            d = await stub.Describe(predictor_pb2.DescribeRequest())
            assert (d.backend, d.artifact_version) == ("qrf", meta.version)
            sample = rows[:16]
            feats = [
                predictor_pb2.FeatureRow(
                    model=r.model,
                    workflow=r.workflow,
                    stage=r.stage,
                    system_text=r.system_text,
                    user_text=r.user_text,
                    prompt_text=r.prompt_text,
                )
                for r in sample
            ]
            resp = await stub.Predict(predictor_pb2.PredictRequest(rows=feats))
            want = q.predict([PredictorInput.from_trace(r) for r in sample], (0.5, 0.9))
            got = np.array([list(p.values) for p in resp.predictions])
            assert np.allclose(got, want, rtol=1e-6)  # float32 on the wire
            many = await asyncio.gather(
                *(stub.Predict(predictor_pb2.PredictRequest(rows=feats[:1])) for _ in range(20))
            )
            assert all(list(r.predictions[0].values) == list(resp.predictions[0].values) for r in many)
    finally:
        await asyncio.wait_for(server.stop(), 30)


@pytest.mark.parametrize("trees", [1, 2, 7, 50])
def test_linear_quantiles_match_numpy_bit_for_bit(trees: int) -> None:
    rng = np.random.default_rng(trees)
    values = rng.lognormal(5.0, 2.0, (4, trees))
    for qs in ([0.5, 0.9], [float(np.float32(0.9)), float(np.float32(0.5))], [0.0, 1.0, 0.25, 0.999, 0.001]):
        want = np.quantile(values, qs, axis=1, method="linear").T
        np.testing.assert_array_equal(linear_quantiles(values, qs), want)
