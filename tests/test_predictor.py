"""Predictor: features, targets, the empirical baseline, Kendall-tau metrics, and the gRPC server.

``synthetic_predictor_traces`` is a tiny, seeded, clearly fake trace set (not the real workload generator
in services/workload): output lengths depend on model, workflow, stage and a per-task difficulty.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import grpc
import numpy as np
import pytest

from chimera.predictor.v1 import predictor_pb2, predictor_pb2_grpc
from services.common.tokens import approx_tokens
from services.common.tracestore import remaining_tokens
from services.common.types import TraceRow
from services.predictor.config import PredictorSettings
from services.predictor.empirical import EmpiricalPredictor
from services.predictor.features import CategoryFeatures, ConcatFeatures, CountFeatures, PredictorInput
from services.predictor.server import PredictorServer
from services.predictor.training import kendall_tau_distance, train_predictor

pytestmark = pytest.mark.unit

STAGE_MEANS = {"code": (300, 500, 150), "math": (120, 400)}
VERBOSITY = {"small": 1.6, "large": 1.0}


def synthetic_predictor_traces(programs: int = 240, seed: int = 3) -> list[TraceRow]:
    rng = random.Random(seed)
    rows: list[TraceRow] = []
    for p in range(programs):
        workflow = rng.choice(sorted(STAGE_MEANS))
        model = rng.choice(sorted(VERBOSITY))
        difficulty = rng.lognormvariate(0.0, 0.4)
        arrival = rng.uniform(0, 600)
        text = f"{workflow} problem {p} " + "word " * rng.randint(5, 60)
        for stage, mean in enumerate(STAGE_MEANS[workflow]):
            tokens = max(1, int(mean * VERBOSITY[model] * difficulty * rng.uniform(0.8, 1.2)))
            rows.append(trace(f"p{p}", workflow, stage, model, text, tokens, arrival + stage))
    rng.shuffle(rows)  # rows arrive from several engines' streams in no particular order
    return rows


def trace(
    pid: str, wf: str, stage: int, model: str, text: str, tokens: int, t: float, attempt: int = 1
) -> TraceRow:
    return TraceRow(
        request_id=f"{pid}-{stage}-{attempt}",
        program_id=pid,
        workflow=wf,
        stage=stage,
        engine=f"e-{model}",
        model=model,
        system_text="You are a careful agent.",
        user_text=text,
        prompt_text=text + " history" * stage * 20,
        prompt_tokens=0,
        completion_tokens=tokens,
        predicted=0,
        predicted_p90=0,
        queue_wait_s=0.0,
        run_s=0.0,
        finish_reason="stop",
        attempt=attempt,
        enqueued_unix=t,
    )


def test_approx_tokens() -> None:
    assert approx_tokens("") == 0 and approx_tokens("   \n") == 0
    assert approx_tokens("Hello, world!") == 4
    assert approx_tokens("x = foo(bar)") == 6
    assert approx_tokens("supercalifragilistic") == 4  # long words count as several pieces
    assert approx_tokens("word " * 100) == 100
    assert approx_tokens("a b c") < approx_tokens("a b c d e f")


def test_remaining_tokens_sums_later_stages_and_dedupes_retries() -> None:
    rows = [
        trace("a", "w", 0, "m", "t", 10, 0),
        trace("a", "w", 2, "m", "t", 1, 0),
        trace("a", "w", 1, "m", "t", 100, 0),
        trace("a", "w", 1, "m", "t", 200, 0, attempt=2),  # the retried stage's tokens count once
        trace("b", "w", 0, "m", "t", 7, 0),
    ]
    assert remaining_tokens(rows) == [211, 1, 201, 201, 7]


def test_feature_extractors() -> None:
    rows = [PredictorInput.from_trace(r) for r in synthetic_predictor_traces(programs=4)]
    feats = ConcatFeatures([CountFeatures(), CategoryFeatures()])
    feats.fit(rows)
    x = feats.transform(rows)
    assert x.shape == (len(rows), 6)
    assert feats.names == (
        "system_tokens",
        "user_tokens",
        "prompt_tokens",
        "model_id",
        "workflow_id",
        "stage",
    )
    assert (x[:, 2] >= x[:, 1]).all()  # the prompt contains the task text
    unseen = PredictorInput("other", "other", 0, "", "", "")
    assert list(feats.transform([unseen])[0]) == [0, 0, 0, -1, -1, 0]


def test_kendall_tau_distance() -> None:
    assert kendall_tau_distance([1, 2, 3, 4], [10, 20, 30, 40]) == 0.0
    assert kendall_tau_distance([1, 2, 3, 4], [4, 3, 2, 1]) == 1.0
    assert kendall_tau_distance([1, 2, 3, 4], [0, 0, 0, 0]) == 0.5
    assert kendall_tau_distance([5, 5, 5], [1, 2, 3]) is None
    assert kendall_tau_distance([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)


def test_empirical_quantiles_and_fallbacks() -> None:
    rows = synthetic_predictor_traces()
    p = EmpiricalPredictor(min_count=5)
    p.fit(rows)
    assert p.models == ("large", "small")
    ask = [
        PredictorInput("small", "code", 0, "", "", ""),
        PredictorInput("large", "code", 0, "", "", ""),
        PredictorInput("large", "code", 2, "", "", ""),
        PredictorInput("large", "code", 9, "", "", ""),  # unseen stage: (model, workflow) fallback
        PredictorInput("large", "unseen", 0, "", "", ""),  # unseen workflow: (model) fallback
        PredictorInput("unseen", "unseen", 0, "", "", ""),  # global fallback
    ]
    q = p.predict(ask, [0.1, 0.5, 0.9])
    assert q.shape == (6, 3) and (np.diff(q, axis=1) >= 0).all()
    assert q[0, 1] > q[1, 1] * 1.3  # "small" is more verbose
    assert q[1, 1] > q[2, 1] * 3  # stage 0 still has every later stage ahead of it
    assert q[2, 1] < q[3, 1]  # the (model, workflow) pool is mostly earlier, longer stages
    assert np.isfinite(q).all()


def test_training_beats_fcfs_and_input_length(tmp_path: Path) -> None:
    meta = train_predictor(synthetic_predictor_traces(), tmp_path, backend="empirical", holdout=0.3)
    m = meta.metrics
    assert m["test_rows"] > 50
    assert set(m["per_model"]) == {"small", "large"}
    for model, per in m["per_model"].items():
        assert per["kendall_tau_distance"] < per["kendall_tau_distance_fcfs"] - 0.2, model
        assert per["kendall_tau_distance"] < per["kendall_tau_distance_input_length"], model
        assert per["p90_coverage"] > 0.7, model
    assert 0.35 < m["kendall_tau_distance_fcfs"] < 0.65  # FCFS is about random on this data


async def _code(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    return info.value.code()


async def test_server_predicts_and_rejects_bad_input(tmp_path: Path) -> None:
    settings = PredictorSettings(
        port=0, artifact_dir=tmp_path / "predictor", max_request_items=16, grace_s=1.0
    )
    server = PredictorServer(settings)
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = predictor_pb2_grpc.PredictorStub(channel)
            row = predictor_pb2.FeatureRow(model="small", workflow="code", stage=0, user_text="sum a list")
            req = predictor_pb2.PredictRequest(rows=[row])
            assert await _code(stub.Predict(req)) == grpc.StatusCode.UNAVAILABLE

            meta = train_predictor(synthetic_predictor_traces(), tmp_path, backend="empirical", holdout=0.0)
            assert await server.collector.reload()
            d = await stub.Describe(predictor_pb2.DescribeRequest())
            assert (d.backend, d.artifact_version, list(d.models)) == (
                "empirical",
                meta.version,
                ["large", "small"],
            )

            resp = await stub.Predict(req)
            assert list(resp.quantiles) == pytest.approx([0.5, 0.9]) and resp.artifact_version == meta.version
            p50, p90 = resp.predictions[0].values
            assert 0 < p50 <= p90
            late = predictor_pb2.FeatureRow(model="small", workflow="code", stage=2)
            three = await stub.Predict(
                predictor_pb2.PredictRequest(rows=[row, late], quantiles=[0.25, 0.5, 0.75])
            )
            assert [len(p.values) for p in three.predictions] == [3, 3]
            assert three.predictions[0].values[1] > three.predictions[1].values[1]

            empty = predictor_pb2.PredictRequest()
            assert await _code(stub.Predict(empty)) == grpc.StatusCode.INVALID_ARGUMENT
            for bad_q in ([0.0], [1.0], [0.5, 1.5], [float("nan")]):
                bad = predictor_pb2.PredictRequest(rows=[row], quantiles=bad_q)
                assert await _code(stub.Predict(bad)) == grpc.StatusCode.INVALID_ARGUMENT, bad_q
            unknown = predictor_pb2.PredictRequest(rows=[predictor_pb2.FeatureRow(model="gpt-9")])
            assert await _code(stub.Predict(unknown)) == grpc.StatusCode.NOT_FOUND
            too_many = predictor_pb2.PredictRequest(rows=[row] * 17)
            assert await _code(stub.Predict(too_many)) == grpc.StatusCode.RESOURCE_EXHAUSTED
            # Concurrent callers are merged into shared batches and each gets its own answer.
            many = await asyncio.gather(*(stub.Predict(req) for _ in range(40)))
            assert all(r.predictions[0].values == resp.predictions[0].values for r in many)
            assert max(s.size for s in server.collector.stats) > 1
    finally:
        await asyncio.wait_for(server.stop(), 30)
