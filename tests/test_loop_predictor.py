"""The predictor of open agent loops: moments from loop records, the forest, the qrf backend serving loop
rows from it (in process and through the real gRPC server), and the state the dispatcher builds for a
stage of an open loop. FAKE loop records and the tiny fake traces of tests/test_predictor.py stand in for
data; the real loops are measured by bench.learned.loops."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from test_predictor import synthetic_predictor_traces

from chimera.predictor.v1 import predictor_pb2, predictor_pb2_grpc
from services.common import artifacts
from services.common.chat import Tool, ToolCall, ToolUse
from services.common.types import ChatMessage, LoopState, SamplingParams, StageRequest
from services.dispatcher.tool_results import loop_state
from services.predictor.config import PredictorSettings
from services.predictor.features import PredictorInput
from services.predictor.loops import LoopForest, loop_moments
from services.predictor.qrf import QrfPredictor
from services.predictor.server import PredictorServer
from services.predictor.training import train_predictor

pytestmark = pytest.mark.unit


def _fake_loop(problem: str, model: str, outputs: list[int], passed_last: bool) -> dict[str, Any]:
    turns = [
        {
            "model": model,
            "prompt_tokens": 300 + 100 * k,
            "completion_tokens": n,
            "passed": passed_last and k == len(outputs) - 1,
            "tool_result_chars": 0 if passed_last and k == len(outputs) - 1 else 200 + k,
        }
        for k, n in enumerate(outputs)
    ]
    return {"problem_id": problem, "turns": turns}


def _fake_loops() -> list[dict[str, Any]]:
    """Fake loops whose turns resubmit about the same code until the fourth turn, or pass at once."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(60):
        size = int(rng.integers(40, 200))
        model = "small" if i % 2 else "large"
        if i % 3 == 0:
            out.append(_fake_loop(f"p{i}", model, [size], passed_last=True))
        else:
            out.append(_fake_loop(f"p{i}", model, [size + k for k in range(4)], passed_last=False))
    return out


def test_a_loop_record_becomes_one_moment_per_turn() -> None:
    ms = loop_moments([_fake_loop("p", "m", [50, 60, 70], passed_last=True)])
    assert [m.state.turn for m in ms] == [0, 1, 2]
    assert [m.state.attained_tokens for m in ms] == [0, 50, 110]
    assert [m.remaining for m in ms] == [180, 130, 70]
    assert [m.state.last_tool_failed for m in ms] == [False, True, True]
    assert [m.state.last_tool_chars for m in ms] == [0, 200, 201]
    assert [m.state.last_output_tokens for m in ms] == [0, 50, 60] and ms[2].prompt_tokens == 500


def test_the_forest_learns_that_a_failing_loop_has_less_left_as_it_goes() -> None:
    forest = LoopForest().fit(loop_moments(_fake_loops()))
    assert forest.models == ("large", "small")
    states = [LoopState(k, 150 * k, k > 0, 200 if k else 0, 150 if k else 0) for k in range(4)]
    q = forest.predict(states, ["small"] * 4, (0.9, 0.5))
    assert np.all(q[:, 0] >= q[:, 1]) and np.all(q >= 0)  # p90 >= p50 whatever order they are asked in
    assert q[1, 1] > q[3, 1]  # turn 1 of a failing loop has more left than turn 3


def test_the_qrf_backend_serves_loop_rows_from_the_loop_forest_and_keeps_it_when_saved(
    tmp_path: Path,
) -> None:
    moments = [m for m in loop_moments(_fake_loops()) if m.model == "small"]
    meta = train_predictor(synthetic_predictor_traces(120), tmp_path, holdout=0.0, loops=moments)
    assert meta.metrics["loop_moments"] == len(moments)
    _, model = artifacts.load(tmp_path / "predictor")
    assert isinstance(model, QrfPredictor) and model.loops is not None
    state = LoopState(1, 120, True, 200, 120)
    plain = PredictorInput("small", "code", 1, "s", "a task", "a task and its history")
    looped = PredictorInput("small", "code", 1, "s", "a task", "a task and its history", state)
    other = PredictorInput("large", "code", 1, "s", "a task", "a task and its history", state)
    got = model.predict([plain, looped, other], (0.5, 0.9))
    assert got[1] == pytest.approx(model.loops.predict([state], ["small"], (0.5, 0.9))[0])
    assert got[0] == pytest.approx(model.predict([plain], (0.5, 0.9))[0])
    # No recorded loop ran on "large": its loop rows are predicted as workflows.
    assert got[2] == pytest.approx(
        model.predict(
            [PredictorInput("large", "code", 1, "s", "a task", "a task and its history")], (0.5, 0.9)
        )[0]
    )
    old = pickle.loads(pickle.dumps(model))
    del old.__dict__["loops"]  # as an artifact saved before the loop forest existed
    assert pickle.loads(pickle.dumps(old)).loops is None


@pytest.mark.timeout(120)
async def test_the_server_reads_the_loop_state_off_the_wire(tmp_path: Path) -> None:
    moments = loop_moments(_fake_loops())
    train_predictor(synthetic_predictor_traces(120), tmp_path, holdout=0.0, loops=moments)
    server = PredictorServer(PredictorSettings(port=0, artifact_dir=tmp_path / "predictor", grace_s=1.0))
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = predictor_pb2_grpc.PredictorStub(channel)
            loop = predictor_pb2.LoopState(
                turn=2,
                attained_tokens=300,
                last_tool_failed=True,
                last_tool_chars=210,
                last_output_tokens=150,
            )
            row = predictor_pb2.FeatureRow(model="small", workflow="http", stage=2, user_text="t", loop=loop)
            resp = await stub.Predict(predictor_pb2.PredictRequest(rows=[row]))
        _, model = artifacts.load(tmp_path / "predictor")
        want = model.loops.predict([LoopState(2, 300, True, 210, 150)], ["small"], (0.5, 0.9))[0]
        assert list(resp.predictions[0].values) == pytest.approx(want, rel=1e-5)
    finally:
        await asyncio.wait_for(server.stop(), 30)


def _stage(identity: str, messages: list[ChatMessage], tools: bool = True) -> StageRequest:
    use = ToolUse((Tool("run_tests"),), "function", "run_tests") if tools else None
    return StageRequest("r", "p", 2, "", tuple(messages), SamplingParams(), identity=identity, tool_use=use)


def test_the_dispatcher_reads_a_loops_state_from_its_history_and_program() -> None:
    call = ToolCall("c1", "run_tests", '{"code": "x"}')
    history = [
        ChatMessage("user", "write f"),
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", "FAILED:\nAssertionError: f(2) != 4", tool_call_id="c1"),
    ]
    program = {"attained": "240", "last_output": "130"}
    state = loop_state(_stage("continuation", history), program)
    assert state == LoopState(2, 240, True, len(history[2].content), 130)
    assert loop_state(_stage("session", history, tools=False), program) is not None  # it answers a tool
    # A program the client named is a declared workflow; a chat without tools is no loop.
    assert loop_state(_stage("header", history), program) is None
    assert loop_state(_stage("new", history[:1], tools=False), {}) is None
    first = loop_state(_stage("new", history[:1]), {})
    assert first == LoopState(2, 0, False, 0, 0)
