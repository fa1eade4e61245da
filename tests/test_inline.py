"""Inline inference (``services.dispatcher.inline``): the dispatcher's own router and predictor answer as the
services do over real gRPC, hot reload a newly published version, refuse transformer backends, and leave the
dispatch degraded (not failed) when nothing is loaded."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from bench.load.report import _door
from services.cli.main import app as cli
from services.common import artifacts
from services.common.types import ChatMessage, OutcomeRow, Prediction, SamplingParams, StageRequest, TraceRow
from services.dispatcher.clients import ConfidenceSource, LengthSource, PredictorClient, RouterClient
from services.dispatcher.decision import Timings
from services.dispatcher.inline import WIRE_QUANTILES, cpu_only, inline_sources, wire_float
from services.dispatcher.metrics import DispatcherMetrics
from services.dispatcher.upstream import Upstream
from services.launcher.config import LauncherSettings
from services.launcher.stack import running_stack
from services.predictor.config import PredictorSettings
from services.predictor.server import PredictorServer
from services.predictor.training import train_predictor
from services.router.backends import INLINE_BACKENDS
from services.router.config import RouterSettings
from services.router.server import RouterServer
from services.router.training import train_router

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

MODELS = ("small", "large")
RATES = {"code": {"small": 0.2, "large": 0.8}, "math": {"small": 0.7, "large": 0.6}}


def _traces(tasks: int = 80, seed: int = 3) -> tuple[list[TraceRow], list[OutcomeRow]]:
    """A small, seeded, plainly fake trace set: every task on both models, two stages each."""
    rng = random.Random(seed)
    traces: list[TraceRow] = []
    outcomes: list[OutcomeRow] = []
    for t in range(tasks):
        workflow = "code" if t % 2 else "math"
        text = f"{workflow} task {t}: " + " ".join(
            rng.choice(["sum", "graph", "prime", "sort"]) for _ in range(6)
        )
        for model in MODELS:
            pid = f"p{t}-{model}"
            for stage in range(2):
                traces.append(
                    TraceRow(
                        request_id=f"{pid}-{stage}", program_id=pid, workflow=workflow, stage=stage,
                        engine=f"e-{model}", model=model, system_text="solve", user_text=text,
                        prompt_text=text, prompt_tokens=10, completion_tokens=rng.randint(20, 400),
                        predicted=0, predicted_p90=0, queue_wait_s=0.0, run_s=0.1, finish_reason="stop",
                    )
                )  # fmt: skip
            outcomes.append(
                OutcomeRow(pid, workflow, model, f"e-{model}", float(rng.random() < RATES[workflow][model]))
            )
    return traces, outcomes


def _request(text: str, workflow: str, stage: int = 0) -> StageRequest:
    return StageRequest(
        request_id=f"r-{workflow}-{stage}-{abs(hash(text))}",
        program_id="p",
        stage=stage,
        workflow=workflow,
        messages=(ChatMessage("system", "solve"), ChatMessage("user", text)),
        sampling=SamplingParams(max_tokens=512),
    )


def _settings(root: Path, reload_s: float = 0.05) -> tuple[RouterSettings, PredictorSettings]:
    common = {"port": 0, "metrics_port": 0, "reload_interval_s": reload_s}
    return (
        RouterSettings(artifact_dir=root / "router", **common),
        PredictorSettings(artifact_dir=root / "predictor", **common),
    )


@pytest.fixture
def trained(tmp_path: Path) -> Path:
    traces, outcomes = _traces()
    train_router(traces, outcomes, tmp_path, backend="tfidf")  # the defaults: tf-idf and a quantile forest
    train_predictor(traces, tmp_path, backend="qrf")
    return tmp_path


@pytest.fixture
async def inline(trained: Path) -> AsyncIterator[tuple[ConfidenceSource, LengthSource]]:
    async with inline_sources(*_settings(trained), (5.0, 5.0), CollectorRegistry()) as both:
        yield both


async def test_inline_answers_exactly_as_the_services_do_over_grpc(
    trained: Path, inline: tuple[ConfidenceSource, LengthSource]
) -> None:
    rs, ps = _settings(trained)
    router, predictor = RouterServer(rs), PredictorServer(ps)
    rport, pport = await router.start(), await predictor.start()
    try:
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{rport}") as rc,
            grpc.aio.insecure_channel(f"127.0.0.1:{pport}") as pc,
        ):
            remote_router, remote_predictor = RouterClient(rc, 5.0), PredictorClient(pc, 5.0)
            asks = [
                ("code task 3: sum graph prime", "code"),
                ("math task 8: sort sort", "math"),
                ("unseen", "x"),
            ]
            for text, workflow in asks:
                req = _request(text, workflow)
                assert await inline[0].score(text, workflow, MODELS) == await remote_router.score(
                    text, workflow, MODELS
                )
                assert await inline[1].predict(req, MODELS) == await remote_predictor.predict(req, MODELS)
    finally:
        await router.stop()
        await predictor.stop()


@pytest.mark.parametrize("executor", ["thread", "auto"])
async def test_concurrent_inline_calls_share_batches_on_threads_only(trained: Path, executor: str) -> None:
    """On threads concurrent calls share batches; on the loop (auto, for these CPU backends) each call is
    answered at once as its own."""
    registry = CollectorRegistry()
    rs, ps = _settings(trained)
    rs = rs.model_copy(update={"executor": executor})
    async with inline_sources(rs, ps, (5.0, 5.0), registry) as (router, _):
        texts = [f"code task {i}: sum" for i in range(40)]
        answers = await asyncio.gather(*(router.score(t, "code", MODELS) for t in texts))
    assert all(set(a) == set(MODELS) for a in answers)
    batches = registry.get_sample_value("chimera_router_batch_size_count")
    assert batches is not None
    if executor == "thread":
        assert 1 <= batches < len(texts)
    else:
        assert batches == len(texts)


async def test_a_newly_published_version_is_picked_up(trained: Path) -> None:
    rs, ps = _settings(trained, reload_s=0.05)
    traces, outcomes = _traces()
    async with inline_sources(rs, ps, (5.0, 5.0)) as (router, _):
        before = await router.score("code task 1: sum", "code", MODELS)
        # A prior on flipped outcomes: "small" now always wins and "large" always fails.
        flipped = [
            OutcomeRow(o.program_id, o.workflow, o.model, o.engine, float(o.model == "small"))
            for o in outcomes
        ]
        meta = train_router(traces, flipped, trained, backend="prior", holdout=0.0)
        for _ in range(200):
            after = await router.score("code task 1: sum", "code", MODELS)
            if after != before:
                break
            await asyncio.sleep(0.05)
        prior = artifacts.load_version(trained / "router", meta.version)
        expected = prior.predict_proba(["code task 1: sum"], ["code"])[0]
        assert after == {m: wire_float(float(expected[j])) for j, m in enumerate(prior.models)}
        assert after["small"] > after["large"]


def test_cpu_only_refuses_a_transformer_backend_before_unpickling(tmp_path: Path) -> None:
    kind = tmp_path / "router"
    ok = artifacts.publish(
        kind, {"a": 1}, kind="router", backend="tfidf", data_hash="x", rows=1, models=MODELS
    )
    gpu = artifacts.publish(
        kind, {"a": 2}, kind="router", backend="minilm", data_hash="y", rows=1, models=MODELS
    )
    assert cpu_only(INLINE_BACKENDS, kind, ok.version) == {"a": 1}
    with pytest.raises(artifacts.ArtifactError, match="minilm.*remote"):
        cpu_only(INLINE_BACKENDS, kind, gpu.version)


async def test_a_transformer_version_leaves_the_cpu_one_serving(trained: Path) -> None:
    rs, ps = _settings(trained, reload_s=0.05)
    async with inline_sources(rs, ps, (5.0, 5.0)) as (router, _):
        before = await router.score("math task 2: sort", "math", MODELS)
        artifacts.publish(
            trained / "router", {"not": "a model"}, kind="router", backend="modernbert",
            data_hash="z", rows=1, models=MODELS,
        )  # fmt: skip
        await asyncio.sleep(0.3)  # several reload polls
        assert await router.score("math task 2: sort", "math", MODELS) == before


async def test_nothing_published_degrades_the_dispatch_as_a_down_router_does(tmp_path: Path) -> None:
    up: Mapping[str, Prediction]
    async with inline_sources(*_settings(tmp_path), (5.0, 5.0)) as (router, predictor):
        upstream = Upstream(router, predictor, DispatcherMetrics(CollectorRegistry()))
        degraded: list[str] = []
        req = _request("code task 1: sum", "code")
        assert await upstream.confidences(req, MODELS, Timings(), degraded) == {}
        up = await upstream.predictions(req, MODELS, Timings(), degraded)
    assert degraded == ["router", "predictor"]
    assert up == dict.fromkeys(MODELS, Prediction(512, 512))


def test_wire_quantiles_are_what_a_remote_predictor_receives() -> None:
    assert WIRE_QUANTILES == (0.5, wire_float(0.9)) and WIRE_QUANTILES[1] != 0.9


def test_the_launcher_owns_the_inference_setting(tmp_path: Path) -> None:
    # It also decides whether the model services start, so a dispatcher_env cannot set it behind its back.
    settings = LauncherSettings.ephemeral(tmp_path)
    with (
        pytest.raises(ValueError, match="CHIMERA_DISPATCHER_INFERENCE"),
        running_stack(settings, dispatcher_env={"CHIMERA_DISPATCHER_INFERENCE": "inline"}),
    ):
        pass
    assert LauncherSettings.ephemeral(tmp_path, inference="inline").inference == "inline"
    result = CliRunner().invoke(cli, ["up", "--inference", "sideways"])
    assert result.exit_code == 2 and "remote or inline" in result.output


def test_the_load_report_marks_inline_rows() -> None:
    row = {"phase": {"door": "grpc"}}
    assert _door({**row, "inference": "inline"}) == "grpc (inline)"
    assert _door({**row, "inference": "remote"}) == _door(row) == "grpc"
