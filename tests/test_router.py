"""Router: the prior baseline, training metrics, and the gRPC server on a trace set generated here.

``synthetic_router_traces`` is a tiny, seeded, clearly fake trace set (not the real workload generator in
services/workload): each task runs on each of three models; success rates depend on model and workflow.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chimera.router.v1 import router_pb2, router_pb2_grpc
from services.common import artifacts
from services.common.types import OutcomeRow, TraceRow
from services.router.backends import make_backend, router_examples
from services.router.config import RouterSettings
from services.router.prior import PriorRouter
from services.router.server import SERVICE_NAME, RouterServer
from services.router.training import train_router

# Success probability per (workflow, model): "small" is fine at math, bad at code.
RATES = {
    "code": {"small": 0.15, "medium": 0.5, "large": 0.85},
    "math": {"small": 0.7, "medium": 0.75, "large": 0.8},
}


def synthetic_router_traces(tasks: int = 120, seed: int = 7) -> tuple[list[TraceRow], list[OutcomeRow]]:
    rng = random.Random(seed)
    traces: list[TraceRow] = []
    outcomes: list[OutcomeRow] = []
    for t in range(tasks):
        workflow = "code" if t % 2 else "math"
        text = f"{workflow} task {t}: " + " ".join(
            rng.choice(["sum", "list", "graph", "prime"]) for _ in range(5)
        )
        for model, rate in RATES[workflow].items():
            pid = f"p{t}-{model}"
            for stage in range(2):
                traces.append(_trace(pid, workflow, stage, model, text))
            outcomes.append(OutcomeRow(pid, workflow, model, f"e-{model}", float(rng.random() < rate)))
    return traces, outcomes


def _trace(pid: str, workflow: str, stage: int, model: str, text: str) -> TraceRow:
    return TraceRow(
        request_id=f"{pid}-{stage}",
        program_id=pid,
        workflow=workflow,
        stage=stage,
        engine=f"e-{model}",
        model=model,
        system_text="you are a solver",
        user_text=text if stage == 0 else f"continue: {text}",
        prompt_text=text,
        prompt_tokens=10,
        completion_tokens=50,
        predicted=0,
        predicted_p90=0,
        queue_wait_s=0.0,
        run_s=0.1,
        finish_reason="stop",
    )


@pytest.mark.unit
def test_prior_router_learns_rates_with_shrinkage() -> None:
    traces, outcomes = synthetic_router_traces()
    r = PriorRouter(shrinkage=10.0)
    r.fit(traces, outcomes)
    assert r.models == ("large", "medium", "small")
    proba = r.predict_proba(["a", "b", "c"], ["code", "math", "unseen"])
    assert proba.shape == (3, 3) and ((proba >= 0) & (proba <= 1)).all()
    code, math, unseen = proba
    assert code[0] > code[1] > code[2]  # large > medium > small on code
    assert math[2] > code[2] + 0.3  # small is much better at math
    # Unseen workflow: the model's global rate, between its two workflow rates.
    assert min(code[2], math[2]) < unseen[2] < max(code[2], math[2])


@pytest.mark.unit
def test_join_uses_first_stage_text_and_drops_orphans() -> None:
    traces, outcomes = synthetic_router_traces(tasks=2)
    orphan = OutcomeRow("nobody", "code", "small", "e", 1.0)
    ex = router_examples(list(reversed(traces)), [*outcomes, orphan])
    assert len(ex) == len(outcomes)
    assert all(not e.text.startswith("continue") for e in ex)


@pytest.mark.unit
def test_backend_registry() -> None:
    assert isinstance(make_backend("prior"), PriorRouter)
    assert isinstance(make_backend("services.router.prior:PriorRouter"), PriorRouter)
    with pytest.raises(ValueError, match="unknown router backend"):
        make_backend("nope")


@pytest.mark.unit
def test_training_publishes_version_with_metrics(tmp_path: Path) -> None:
    traces, outcomes = synthetic_router_traces()
    meta = train_router(traces, outcomes, tmp_path, backend="prior", holdout=0.3)
    assert artifacts.current_version(tmp_path / "router") == meta.version
    assert meta.backend == "prior" and meta.models == ("large", "medium", "small")
    m = meta.metrics
    assert m["test_examples"] > 0 and m["train_examples"] > m["test_examples"]
    # Conditioning on the workflow beats the text-blind, workflow-blind prior on this data.
    assert m["macro_map"] > m["macro_map_prior_only"] + 0.02
    # Most of the gain is on "small", whose success depends most on the workflow (prevalence ~0.43).
    assert m["ap_per_model"]["small"] > 0.6
    again = train_router(traces, outcomes, tmp_path, holdout=0.3)
    assert again.data_hash == meta.data_hash and again.version != meta.version


@pytest.fixture
async def router(tmp_path: Path) -> AsyncIterator[tuple[RouterServer, router_pb2_grpc.RouterStub]]:
    settings = RouterSettings(
        host="127.0.0.1",
        port=0,
        artifact_dir=tmp_path / "router",
        max_request_items=8,
        reload_interval_s=0.1,
        grace_s=1.0,
    )
    server = RouterServer(settings)
    port = await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield server, router_pb2_grpc.RouterStub(channel)
    finally:
        await channel.close()
        await asyncio.wait_for(server.stop(), 30)


async def _code(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    return info.value.code()


@pytest.mark.unit
async def test_server_without_artifact_is_unavailable_then_serves(tmp_path: Path, router: tuple) -> None:
    server, stub = router
    item = router_pb2.RouterInput(text="sum a list", workflow="code")
    assert await _code(stub.Score(router_pb2.ScoreRequest(items=[item]))) == grpc.StatusCode.UNAVAILABLE
    assert await _code(stub.Describe(router_pb2.DescribeRequest())) == grpc.StatusCode.UNAVAILABLE
    hchannel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    hstub = health_pb2_grpc.HealthStub(hchannel)
    h = await hstub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
    assert h.status == health_pb2.HealthCheckResponse.NOT_SERVING

    traces, outcomes = synthetic_router_traces()
    meta = train_router(traces, outcomes, tmp_path, backend="prior", holdout=0.2)
    deadline = time.monotonic() + 30
    while server.collector.current is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    d = await stub.Describe(router_pb2.DescribeRequest())
    assert (d.backend, d.artifact_version, list(d.models)) == ("prior", meta.version, list(meta.models))
    h = await hstub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
    assert h.status == health_pb2.HealthCheckResponse.SERVING
    await hchannel.close()

    items = [router_pb2.RouterInput(text="t", workflow=w) for w in ("code", "math")]
    resp = await stub.Score(router_pb2.ScoreRequest(items=items))
    assert resp.artifact_version == meta.version and len(resp.scores) == 2
    code, math = (dict(s.confidence) for s in resp.scores)
    assert set(code) == {"small", "medium", "large"}
    assert code["large"] > code["small"] and math["small"] > code["small"]
    only = await stub.Score(router_pb2.ScoreRequest(items=items[:1], models=["small"]))
    assert set(only.scores[0].confidence) == {"small"}


@pytest.mark.unit
async def test_server_bad_inputs(tmp_path: Path) -> None:
    traces, outcomes = synthetic_router_traces(tasks=20)
    train_router(traces, outcomes, tmp_path, holdout=0.0)
    settings = RouterSettings(port=0, artifact_dir=tmp_path / "router", max_request_items=8, grace_s=1.0)
    server = RouterServer(settings)
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = router_pb2_grpc.RouterStub(channel)
            item = router_pb2.RouterInput(text="x", workflow="code")
            assert await _code(stub.Score(router_pb2.ScoreRequest())) == grpc.StatusCode.INVALID_ARGUMENT
            too_many = router_pb2.ScoreRequest(items=[item] * 9)
            assert await _code(stub.Score(too_many)) == grpc.StatusCode.RESOURCE_EXHAUSTED
            unknown = router_pb2.ScoreRequest(items=[item], models=["small", "gpt-9"])
            assert await _code(stub.Score(unknown)) == grpc.StatusCode.NOT_FOUND
            ok = await stub.Score(router_pb2.ScoreRequest(items=[item] * 8))
            assert len(ok.scores) == 8
    finally:
        await asyncio.wait_for(server.stop(), 30)
