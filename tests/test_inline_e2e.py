"""Inline inference on real processes: a private redis-server, two workers over simulated engines and a
dispatcher with ``CHIMERA_DISPATCHER_INFERENCE=inline``, started by the launcher (``inference="inline"``),
which starts no router and no predictor service. Over gRPC, a first stage is routed and predicted by the
dispatcher's own models (the decision record, as ``chimera explain`` reads it, holds their confidences and
nothing degraded), and a version published into the artifact folder afterwards, as the retrain job
publishes one, is what later dispatches use."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from services.common import artifacts
from services.common.keys import Keys
from services.common.types import OutcomeRow, TraceRow
from services.dispatcher.inline import WIRE_QUANTILES, wire_float
from services.inspect.explain import explain
from services.launcher.config import LauncherSettings
from services.launcher.pool import EngineSpec, PoolSpec
from services.launcher.stack import Stack, running_stack
from services.predictor.features import PredictorInput
from services.predictor.training import train_predictor
from services.router.training import train_router
from services.sdk import AsyncClient, Sampling

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MODELS = ("m-a", "m-b")
PROFILE = {
    "decode_ms_per_token": 10.0,
    "max_batch_size": 8,
    "prefill_ms_per_token": 0.0,
    "step_ms": [[1, 10.0]],
}
TASK = "code task: add two numbers"


def _rows(favoured: str, tokens: int) -> tuple[list[TraceRow], list[OutcomeRow]]:
    """Plainly fake traces: ``favoured`` always succeeds, the other never; each stage ``tokens`` long."""
    traces, outcomes = [], []
    for t in range(30):
        for model in MODELS:
            pid = f"p{t}-{model}"
            traces.append(
                TraceRow(
                    request_id=pid, program_id=pid, workflow="code", stage=0, engine=model, model=model,
                    system_text="", user_text=f"task {t}", prompt_text=f"task {t}", prompt_tokens=5,
                    completion_tokens=tokens, predicted=0, predicted_p90=0, queue_wait_s=0.0, run_s=0.1,
                    finish_reason="stop",
                )
            )  # fmt: skip
            outcomes.append(OutcomeRow(pid, "code", model, model, float(model == favoured)))
    return traces, outcomes


def _publish(root: Path, favoured: str, tokens: int) -> tuple[str, str]:
    traces, outcomes = _rows(favoured, tokens)
    router = train_router(traces, outcomes, root, backend="prior", holdout=0.0)
    predictor = train_predictor(traces, root, backend="empirical", holdout=0.0)
    return router.version, predictor.version


def _expected(root: Path, versions: tuple[str, str]) -> tuple[dict[str, float], int]:
    """What the dispatcher should record with these versions serving: q per model, and m-a's p50."""
    router = artifacts.load_version(root / "router", versions[0])
    q = router.predict_proba([TASK], ["code"])[0]
    predictor = artifacts.load_version(root / "predictor", versions[1])
    row = PredictorInput(
        model="m-a", workflow="code", stage=0, system_text="", user_text=TASK, prompt_text=TASK
    )
    p50 = predictor.predict([row], WIRE_QUANTILES)[0][0]
    return {m: wire_float(float(q[j])) for j, m in enumerate(router.models)}, max(1, round(wire_float(p50)))


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    # Artifacts that cover the pool are there before the launcher looks, so it bootstraps none.
    _publish(tmp_path / "artifacts", favoured="m-a", tokens=40)
    monkeypatch.setenv("CHIMERA_ROUTER_RELOAD_INTERVAL_S", "0.2")
    monkeypatch.setenv("CHIMERA_PREDICTOR_RELOAD_INTERVAL_S", "0.2")
    env = {"time_scale": "100", "profile_json": json.dumps(PROFILE)}
    pool = PoolSpec(
        engines=tuple(EngineSpec(id=m, model=m, kind="simulated", max_num_seqs=8, env=env) for m in MODELS)
    )
    with running_stack(LauncherSettings.ephemeral(tmp_path, inference="inline"), pool) as s:
        yield s


async def _first_stage(stack: Stack, redis: Redis) -> tuple[dict[str, float], int, tuple[str, ...]]:
    """One new workflow's first stage through the gRPC door; its recorded q, ŷ and degraded parts."""
    rid = f"r-{uuid.uuid4().hex[:8]}"
    async with AsyncClient(stack.dispatcher_addr) as client:
        done = await client.generate(
            TASK,
            program_id=f"p-{rid}",
            stage=0,
            workflow="code",
            request_id=rid,
            sampling=Sampling(max_tokens=16),
        )
    ex = await explain(redis, Keys(stack.key_prefix), rid)
    assert ex.model == done.model
    y = done.predicted_tokens if done.model == "m-a" else -1
    return {c.model: c.q for c in ex.candidates}, y, ex.degraded


async def test_inline_dispatcher_routes_predicts_and_reloads_without_model_services(stack: Stack) -> None:
    assert not {"router", "predictor"} & {c.name for c in stack.supervisor.children}
    assert stack.router_addr == stack.predictor_addr == ""
    root = stack.state_dir / "artifacts"
    first = (
        artifacts.current_version(root / "router") or "",
        artifacts.current_version(root / "predictor") or "",
    )
    redis = Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        q, y, degraded = await _first_stage(stack, redis)
        want_q, want_y = _expected(root, first)
        assert degraded == ()
        assert q == want_q and q["m-a"] > q["m-b"]
        assert y == want_y

        # As the retrain job publishes: the other model now wins, and stages run ten times longer.
        second = _publish(root, favoured="m-b", tokens=400)
        want_q2, _ = _expected(root, second)
        deadline = time.monotonic() + 30
        while q != want_q2 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            q, _, degraded = await _first_stage(stack, redis)
        assert q == want_q2 and q["m-b"] > q["m-a"] and degraded == ()
        # The predictor reloads on its own poll: wait for its answer too (on m-a, pinned).
        want_y2 = _expected(root, second)[1]
        async with AsyncClient(stack.dispatcher_addr) as client:
            while time.monotonic() < deadline:
                done = await client.generate(
                    TASK, program_id=f"p-{uuid.uuid4().hex[:8]}", stage=0, workflow="code", model="m-a",
                    sampling=Sampling(max_tokens=16),
                )  # fmt: skip
                if done.predicted_tokens == want_y2:
                    break
                await asyncio.sleep(0.2)
        assert done.predicted_tokens == want_y2 != want_y
    finally:
        await redis.aclose()
