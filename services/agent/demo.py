"""``chimera demo --agent``: the coding agent on the same tasks as Chimera routes it and as each model alone
serves it, through the OpenAI door with no Chimera header (``services.agent.coding``).

The arms run as the gRPC demo's do (``services.demo.arms``'s NOTE(arms)): the alone arms together, one per
engine, then Chimera's on the whole pool; each arm sends its loops at once, so queues form. Each loop's
verified outcome goes back as its program's label.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Mapping, Sequence

import openai
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from services.agent.coding import AgentRun, end_loop, pass_rate, run_agent
from services.agent.run_tests import code_check
from services.demo.arms import Arm
from services.launcher.stack import Stack
from services.verify.answers import AnswerKey
from services.workload.corpus import Problem


def done_line(arm: str, run: AgentRun, done: int, total: int) -> str:
    """``[3/8] chimera humaneval/12: 2 turns on e0, 31.4 s, passed``."""
    engines = ",".join(sorted({t.engine for t in run.turns})) or "-"
    if run.error:
        verdict = f"[red]failed: {escape(run.error)}[/]"
    else:
        verdict = "[green]passed[/]" if run.passed else "tests still failing"
    head = f"  [{done}/{total}] {escape(arm)} {run.problem_id}"
    return f"{head}: {len(run.turns)} turns on {engines}, {run.e2e_s:.1f} s, {verdict}"


async def _arm(
    console: Console,
    stack: Stack,
    arm: Arm,
    tasks: Sequence[Problem],
    key: AnswerKey,
    max_turns: int,
    max_tokens: int,
    progress: list[int],
    total: int,
) -> list[AgentRun]:
    async with openai.AsyncOpenAI(
        base_url=f"http://{stack.http_addr}/v1", api_key="unused", max_retries=0, timeout=1800
    ) as client:

        async def one(problem: Problem) -> AgentRun:
            run = await run_agent(
                client,
                problem,
                code_check(key, problem.id),
                model=arm.model or "auto",
                max_turns=max_turns,
                max_tokens=max_tokens,
            )
            await end_loop(client, run)
            progress[0] += 1
            console.print(done_line(arm.name, run, progress[0], total))
            return run

        return list(await asyncio.gather(*(one(p) for p in tasks)))


async def run_agent_arms(
    console: Console,
    stack: Stack,
    arms: Sequence[Arm],
    tasks: Sequence[Problem],
    key: AnswerKey,
    max_turns: int,
    max_tokens: int,
) -> dict[str, list[AgentRun]]:
    """The alone arms together, then Chimera's; each arm's loops, Chimera's first."""
    results: dict[str, list[AgentRun]] = {}
    alone = [a for a in arms if a.model]
    if alone:
        console.print(f"each model alone: {len(tasks)} agent loops on each engine, sent at once")
        progress, total = [0], len(tasks) * len(alone)
        runs = await asyncio.gather(
            *(_arm(console, stack, a, tasks, key, max_turns, max_tokens, progress, total) for a in alone)
        )
        results.update({a.name: r for a, r in zip(alone, runs, strict=True)})
    for arm in (a for a in arms if not a.model):
        console.print(f"Chimera choosing per loop: the same {len(tasks)} loops on the whole pool")
        mine = await _arm(console, stack, arm, tasks, key, max_turns, max_tokens, [0], len(tasks))
        results = {arm.name: mine} | results
    return results


def print_agent_arms(console: Console, arms: Mapping[str, Sequence[AgentRun]]) -> None:
    """Per arm, on the same tasks: verified pass rate, turns, end-to-end time, and whether each loop stayed
    one program on one engine."""
    table = Table(title="the coding agent on the same tasks: Chimera's choice beside each model alone")
    for col in ("arm", "loops", "verified pass", "mean turns", "mean e2e s", "p90 e2e s", "one program"):
        table.add_column(col)
    for name, runs in arms.items():
        ok = [r for r in runs if not r.error]
        times = sorted(r.e2e_s for r in ok)
        p90 = times[min(len(times) - 1, int(0.9 * len(times)))] if times else 0.0
        whole = sum(
            len({t.program_id for t in r.turns}) == 1 and len({t.engine for t in r.turns}) == 1 for r in ok
        )
        table.add_row(
            escape(name),
            f"{len(ok)}/{len(runs)}",
            f"{pass_rate(runs):.3f}",
            f"{statistics.fmean(len(r.turns) for r in ok):.2f}" if ok else "-",
            f"{statistics.fmean(times):.1f}" if times else "-",
            f"{p90:.1f}",
            f"{whole}/{len(ok)}",
        )
    console.print(table)
