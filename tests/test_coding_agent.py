"""The coding agent (``services.agent``): its ``run_tests`` tool on the real sandbox, and its loop through a
real stack of processes with SIMULATED engines (a measuring instrument: they call the forced tool with the
placeholder ``"x"`` as the code, so every submission fails and the loop runs to its turn limit). The loop
on a real model is in tests/test_tools_vllm.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import redis
from dispatcher_fakes import simulated_stack

from services.agent.coding import AgentRun, end_loop, run_agent
from services.agent.collect import LOOPS, collected, summarise
from services.agent.run_tests import PASSED, run_tests
from services.common.keys import Keys
from services.launcher.stack import Stack
from services.verify.checks import HumanEvalCheck
from services.verify.sandbox import Limits
from services.workload.corpus import Problem

ADD = HumanEvalCheck(
    prompt='def add(a: int, b: int) -> int:\n    """Return the sum of a and b."""\n',
    test="def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
    entry_point="add",
)
PROBLEM = Problem("humaneval/add", ADD.prompt, "code", 0.1, "humaneval")
LIMITS = Limits(timeout_s=3.0, cpu_s=3)


@pytest.mark.unit
def test_run_tests_passes_a_right_solution_and_shows_how_a_wrong_one_fails() -> None:
    assert run_tests(ADD, "def add(a, b):\n    return a + b\n", LIMITS).text == PASSED
    wrong = run_tests(ADD, "```python\ndef add(a, b):\n    return a - b\n```", LIMITS)
    assert not wrong.passed and wrong.status == "error"
    # The failing assertion and its line, without the sandbox's temporary folder.
    assert "assert candidate(2, 3) == 5" in wrong.text and "AssertionError" in wrong.text
    assert "chimera-verify-" not in wrong.text
    assert (
        "sandbox_boot" not in wrong.text and "runpy" not in wrong.text
    )  # the sandbox's frames, not the code's
    assert wrong.text.startswith("FAILED:\nTraceback")
    endless = run_tests(ADD, "def add(a, b):\n    while True:\n        pass\n", LIMITS)
    assert (endless.passed, endless.status) == (False, "timeout") and "did not finish" in endless.text
    assert run_tests(ADD, "   ", LIMITS).status == "no code"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with simulated_stack(tmp_path_factory.mktemp("coding-agent")) as s:
        yield s


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_the_loop_is_one_program_on_one_engine_and_its_outcome_is_kept(stack: Stack) -> None:
    async def loop() -> AgentRun:
        async with openai.AsyncOpenAI(
            base_url=f"http://{stack.http_addr}/v1", api_key="unused", max_retries=0, timeout=60
        ) as client:
            run = await run_agent(client, PROBLEM, ADD, max_turns=3, max_tokens=32, limits=LIMITS)
            assert await end_loop(client, run)
            return run

    run = asyncio.run(loop())
    assert run.error is None and not run.passed  # "x" is no solution
    turns = run.turns
    assert [(t.stage, t.identity) for t in turns] == [(0, "new"), (1, "continuation"), (2, "continuation")]
    assert len({t.program_id for t in turns}) == 1 and len({t.engine for t in turns}) == 1
    assert all(t.tool_status == "error" and t.tool_result_chars > 0 for t in turns)
    r = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        keys = Keys(stack.key_prefix)
        rows = [json.loads(f["row"]) for _, f in r.xrange(keys.outcomes())]
        assert not r.exists(keys.program(run.program_id))
    finally:
        r.close()
    assert (run.program_id, 0.0) in {(row["program_id"], row["outcome"]) for row in rows}


@pytest.mark.unit
def test_a_collection_knows_what_it_holds_and_sums_it_up(tmp_path: Path) -> None:
    # Made-up loop records (not measurements): the resume key and the summary's arithmetic.
    rows = [
        {"engine": "coder-0_5b", "problem_id": "humaneval/1", "passed": True, "n_turns": 1, "e2e_s": 10.0},
        {
            "engine": "coder-0_5b",
            "problem_id": "humaneval/2",
            "passed": True,
            "n_turns": 3,
            "e2e_s": 30.0,
            "turns": [{"prompt_tokens": 100, "cached_tokens": 0}]
            + [{"prompt_tokens": 200, "cached_tokens": 150}] * 2,
        },
        {"engine": "coder-0_5b", "problem_id": "leetcode/7", "passed": False, "n_turns": 4, "e2e_s": 50.0},
        {"engine": "coder-1_5b", "problem_id": "humaneval/1", "passed": True, "n_turns": 1, "e2e_s": 20.0},
    ]
    (tmp_path / LOOPS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert collected(tmp_path) == {(r["engine"], r["problem_id"]) for r in rows}
    small = summarise(tmp_path)["coder-0_5b"]
    assert (small["loops"], small["passed_first_turn"], small["passed_after_a_failure"]) == (3, 1, 1)
    assert small["pass_rate"] == round(2 / 3, 4) and small["mean_turns"] == round(8 / 3, 3)
    assert small["cached_share_after_a_tool"] == 0.75  # turns after the first only: 300 of 400
    assert json.loads((tmp_path / "summary.json").read_text())["coder-1_5b"]["pass_rate"] == 1.0
