"""A coding agent with one tool, as an agent framework would run it: the official ``openai`` client, the
problem as the user's message, the ``run_tests`` tool (``services.agent.run_tests``), and a loop that
submits code, reads the test report and submits again until the tests pass or ``max_turns`` is spent.

It sends no Chimera header: the door finds the loop's program by conversation continuation (every turn
sends the whole conversation back), which is what this agent is here to exercise. What the door said of
each turn (``X-Chimera-Program-Id``, ``-Stage``, ``-Identity``, ``-Engine``) is recorded when present, so
the same agent runs against a bare ``vllm serve`` too. The loop's verified outcome goes back with
``POST /v1/programs/{id}/end`` (a label for the router), as the gRPC demo's ``EndProgram`` does.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import openai
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionNamedToolChoiceParam

from services.agent.run_tests import FORCED, NAME, TOOL, TestReport, run_tests
from services.verify.checks import HumanEvalCheck, LeetCodeCheck
from services.verify.sandbox import Limits
from services.workload.corpus import Problem

SYSTEM = (
    "You are a careful Python programmer. Solve the task by calling the run_tests tool with your complete "
    "solution. If the tests fail, read the failure, fix the code and call run_tests again."
)


@dataclass(frozen=True, slots=True)
class AgentTurn:
    turn: int
    program_id: str  # "" where the server says nothing (a bare vllm serve)
    stage: int | None
    identity: str
    engine: str
    model: str
    prompt_tokens: int
    cached_tokens: int  # of prompt_tokens, the engine's prefix-cache hits (0 where the server says nothing)
    completion_tokens: int
    e2e_s: float  # the model's answer, not the tool's run
    tool_s: float
    passed: bool
    tool_status: str
    tool_result_chars: int


@dataclass
class AgentRun:
    problem_id: str
    model: str  # asked for: "auto" lets Chimera choose
    turns: list[AgentTurn] = field(default_factory=list)
    e2e_s: float = 0.0  # the whole loop, tools included
    error: str | None = None

    @property
    def passed(self) -> bool:
        return bool(self.turns) and self.turns[-1].passed

    @property
    def program_id(self) -> str:
        return self.turns[0].program_id if self.turns else ""

    def record(self) -> dict[str, Any]:
        """One JSON line: the loop, each turn's tokens and timing, and the verified outcome."""
        return {**asdict(self), "passed": self.passed, "n_turns": len(self.turns)}


def _submitted(arguments: str) -> str:
    """The code of a ``run_tests`` call; "" when its arguments are not the object the schema asks for."""
    try:
        args = json.loads(arguments)
    except ValueError:
        return ""
    code = args.get("code") if isinstance(args, dict) else None
    return code if isinstance(code, str) else ""


def _cached(usage: Any) -> int:
    details = getattr(usage, "prompt_tokens_details", None)
    return int(getattr(details, "cached_tokens", 0) or 0)


async def _turn(
    client: openai.AsyncOpenAI, messages: list[Any], model: str, max_tokens: int
) -> tuple[Any, Any, float]:
    t0 = time.monotonic()
    raw = await client.chat.completions.with_raw_response.create(
        model=model,
        messages=messages,
        tools=[cast(ChatCompletionFunctionToolParam, TOOL)],
        tool_choice=cast(ChatCompletionNamedToolChoiceParam, FORCED),
        temperature=0,
        max_tokens=max_tokens,
    )
    return raw, raw.parse(), time.monotonic() - t0


async def run_agent(
    client: openai.AsyncOpenAI,
    problem: Problem,
    check: HumanEvalCheck | LeetCodeCheck,
    *,
    model: str = "auto",
    max_turns: int = 4,
    max_tokens: int = 512,
    limits: Limits = Limits(),
) -> AgentRun:
    """Run the loop on ``problem``; the run records every turn and, on failure, why it stopped."""
    run = AgentRun(problem.id, model)
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": problem.text}]
    t0 = time.monotonic()
    try:
        for turn in range(max_turns):
            raw, resp, took = await _turn(client, messages, model, max_tokens)
            message = resp.choices[0].message
            calls = [c for c in message.tool_calls or () if c.function.name == NAME]
            if not calls:
                run.error = f"turn {turn}: the model answered without calling {NAME}"
                break
            t_tool = time.monotonic()
            report: TestReport = await asyncio.to_thread(
                run_tests, check, _submitted(calls[0].function.arguments), limits
            )
            h = raw.headers
            stage = h.get("x-chimera-stage")
            run.turns.append(
                AgentTurn(
                    turn=turn,
                    program_id=h.get("x-chimera-program-id", ""),
                    stage=int(stage) if stage is not None else None,
                    identity=h.get("x-chimera-identity", ""),
                    engine=h.get("x-chimera-engine", ""),
                    model=resp.model,
                    prompt_tokens=resp.usage.prompt_tokens if resp.usage else 0,
                    cached_tokens=_cached(resp.usage),
                    completion_tokens=resp.usage.completion_tokens if resp.usage else 0,
                    e2e_s=took,
                    tool_s=time.monotonic() - t_tool,
                    passed=report.passed,
                    tool_status=report.status,
                    tool_result_chars=len(report.text),
                )
            )
            # The history as a framework sends it back: the call (only the one answered), then its result.
            answered = calls[0].model_dump(exclude_none=True)
            messages += [
                {"role": "assistant", "content": None, "tool_calls": [answered]},
                {"role": "tool", "tool_call_id": calls[0].id, "content": report.text},
            ]
            if report.passed:
                break
    except openai.APIError as e:
        run.error = f"{type(e).__name__}: {e}"
    run.e2e_s = time.monotonic() - t0
    return run


async def end_loop(client: openai.AsyncOpenAI, run: AgentRun) -> bool:
    """Label the loop's program with its verified outcome (Chimera's ``/v1/programs/{id}/end``); whether
    the program was found. A server that is not Chimera named no program, and nothing is sent; nor for a
    loop cut short by an error, which says nothing of the model."""
    if not run.program_id or run.error:
        return False
    ended: dict[str, Any] = await client.post(
        f"/programs/{run.program_id}/end", body={"outcome": float(run.passed)}, cast_to=dict
    )
    return bool(ended.get("found"))


def pass_rate(runs: Sequence[AgentRun]) -> float:
    return sum(r.passed for r in runs) / len(runs) if runs else 0.0
