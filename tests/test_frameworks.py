"""The agent-framework integrations with the real ``langgraph`` + ``langchain-openai`` and ``openai-agents``
packages against a real stack (every service a process, two simulated engines): a four-stage graph and a
three-agent handoff each land as one program with consecutive stages on one engine, streamed and not, a
concurrent second run gets a program of its own, and the examples run (short ``max_tokens``)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import redis
from dispatcher_fakes import simulated_stack

from chimera_client.program import ProgramRun
from services.common.keys import Keys
from services.launcher.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with simulated_stack(tmp_path_factory.mktemp("frameworks")) as s:
        yield s


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _outcomes(stack: Stack) -> dict[str, float]:
    r = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        rows = [json.loads(f["row"]) for _, f in r.xrange(Keys(stack.key_prefix).outcomes())]
    finally:
        r.close()
    return {row["program_id"]: row["outcome"] for row in rows}


def _one_program(run: ProgramRun, n_stages: int) -> None:
    """Consecutive stages 0..n-1 of the run's program, all on one engine and model."""
    assert [s.stage for s in run.stages] == list(range(n_stages)), run.stages
    assert len({(s.engine, s.model) for s in run.stages}) == 1, run.stages
    assert all(s.engine for s in run.stages)


# --- LangGraph -------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
@pytest.mark.parametrize("door", ["grpc", "http"])
def test_a_langgraph_run_is_one_program(stack: Stack, door: str, stream: bool) -> None:
    example = _load("langgraph_code_workflow")
    http = f"http://{stack.http_addr}/v1" if door == "http" else None
    run = example.run(stack.dispatcher_addr, http, max_tokens=MAX_TOKENS, stream=stream)
    _one_program(run, 4)
    if door == "grpc" and not stream:
        assert all(s.queue_wait_s is not None for s in run.stages)
    assert run.program_id in _outcomes(stack)  # the graph's outcome went out with EndProgram


async def test_concurrent_langgraph_runs_get_their_own_programs(stack: Stack) -> None:
    from chimera_client.langchain import ChimeraChatModel
    from chimera_client.langgraph import instrument

    example = _load("langgraph_code_workflow")
    runs: list[ProgramRun] = []
    llm = ChimeraChatModel(addr=stack.dispatcher_addr, max_tokens=MAX_TOKENS)
    graph = instrument(example.build(llm), addr=stack.dispatcher_addr, on_end=runs.append)
    await asyncio.gather(graph.ainvoke({"task": example.TASK}), graph.ainvoke({"task": example.TASK}))
    assert len({r.program_id for r in runs}) == 2
    for run in runs:
        _one_program(run, 4)


# --- OpenAI Agents SDK ------------------------------------------------------------------------------

HANDOFF = (
    ("planner", "You plan."),
    ("coder", "You write the code."),
    ("reviewer", "You review the code."),
)


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
async def test_an_agents_handoff_run_is_one_program(stack: Stack, stream: bool) -> None:
    example = _load("agents_code_workflow")
    run = await example.run(
        stack.dispatcher_addr, MAX_TOKENS, stream, roles=HANDOFF, workflow="code/planner-coder-reviewer"
    )
    _one_program(run, 3)  # three agents, one model call each, handed off in order
    assert run.program_id in _outcomes(stack)


async def test_concurrent_agents_runs_get_their_own_programs(stack: Stack) -> None:
    example = _load("agents_code_workflow")
    a, b = await asyncio.gather(
        *(example.run(stack.dispatcher_addr, MAX_TOKENS, roles=HANDOFF) for _ in range(2))
    )
    assert a.program_id != b.program_id
    _one_program(a, 3)
    _one_program(b, 3)


# --- the examples, whole ----------------------------------------------------------------------------


def test_the_examples_run(stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    lg = _load("langgraph_code_workflow")
    assert lg.main(["--addr", stack.dispatcher_addr, "--max-tokens", str(MAX_TOKENS)]) == 0
    ag = _load("agents_code_workflow")
    assert ag.main(["--addr", stack.dispatcher_addr, "--max-tokens", str(MAX_TOKENS), "--stream"]) == 0
    out = capsys.readouterr().out
    assert out.count("stage 3:") == 2 and "queue wait" in out, out
