"""What the demo compares: the same tasks served by Chimera's choice and by each model of the pool alone.

NOTE(arms): the point of Chimera is the choice between models, so the demo shows it beside the two obvious
alternatives on the same tasks: every workflow on the fast weak model, every workflow on the slow strong
one. The "alone" arms run together, one per engine (each engine has its own cores, so neither slows the
other); Chimera's arm runs after them on the whole pool, where its router and load balancer decide. Each
arm sends its workflows at once, so queues form and the choice matters.

The tasks are HumanEval problems, one ``code/coder`` stage each, with the stage budget the real traces use
(512 tokens): the task on which the pool's small models do succeed (bench/data/real: Qwen2.5-Coder-0.5B
passes 7 of 19, SmolLM2-135M 0 of 18). Problems the real traces contain are left out: the first router learnt
from those traces, and a demo on its training set would flatter it.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from services.common.tracestore import read_trace_folder
from services.demo.client import WorkflowRun, run_workflows
from services.demo.report import done_line, print_queue_snapshot
from services.launcher.stack import Stack
from services.verify.answers import AnswerKey
from services.workload.corpus import Problem
from services.workload.workflows import Workflow

CHIMERA = "chimera"


@dataclass(frozen=True, slots=True)
class Arm:
    name: str  # "chimera", or the model served alone
    model: str  # "" lets Chimera choose; else the pin


def seen_problems(folder: Path | None) -> set[str]:
    """Problem ids the real traces in ``folder`` hold (``extra.problem_id`` of their rows)."""
    if folder is None or not folder.is_dir():
        return set()
    traces, _ = read_trace_folder(folder)
    return {str(t.extra["problem_id"]) for t in traces if t.extra.get("problem_id")}


def demo_tasks(
    problems: Sequence[Problem],
    key: AnswerKey,
    workflow: Workflow,
    n: int,
    seed: int,
    source: str = "humaneval",
    exclude: Iterable[str] = (),
) -> list[Problem]:
    """``n`` problems of ``source`` that the answer key can check and ``exclude`` does not hold, drawn with
    ``seed``; fewer if there are not that many."""
    skip = set(exclude)
    pool = [
        p
        for p in problems
        if p.source == source
        and p.domain == workflow.domain
        and p.id not in skip
        and key.get(p.id) is not None
    ]
    return random.Random(seed).sample(pool, min(n, len(pool)))


def arm_runs(arm: Arm, workflow: Workflow, tasks: Sequence[Problem]) -> list[WorkflowRun]:
    """One run per task for ``arm``: its own program ids, every stage pinned to the arm's model if any."""
    tag = re.sub(r"[^a-z0-9]+", "-", arm.name.rsplit("/", 1)[-1].lower()).strip("-")[:24]
    return [WorkflowRun(f"demo-{tag}-{uuid.uuid4().hex[:8]}", workflow, p, model=arm.model) for p in tasks]


def arms_for(models: Sequence[str]) -> tuple[Arm, ...]:
    """Chimera first, then each served model alone."""
    return (Arm(CHIMERA, ""), *(Arm(m, m) for m in models))


async def run_arms(
    console: Console,
    stack: Stack,
    arms: Sequence[Arm],
    workflow: Workflow,
    tasks: Sequence[Problem],
    max_tokens: int,
    key: AnswerKey,
    tick_s: float = 30.0,
) -> dict[str, list[WorkflowRun]]:
    """The alone arms together, then Chimera's; a line per finished workflow and a progress line every
    ``tick_s`` in between. Returns each arm's runs, Chimera's first."""
    results: dict[str, list[WorkflowRun]] = {}
    alone = [a for a in arms if a.model]
    if alone:
        names = ", ".join(a.name for a in alone)
        console.print(f"each model alone ({names}): {len(tasks)} workflows on each engine, sent at once")
        runs = {a.name: arm_runs(a, workflow, tasks) for a in alone}
        await _watched(console, stack, runs, max_tokens, key, tick_s)
        results.update(runs)
    chimera = [a for a in arms if not a.model]
    if chimera:
        console.print(f"Chimera choosing per workflow: the same {len(tasks)} workflows on the whole pool")
        runs = {a.name: arm_runs(a, workflow, tasks) for a in chimera}
        await _watched(console, stack, runs, max_tokens, key, tick_s, snapshot=True)
        results = runs | results
    return results


async def _watched(
    console: Console,
    stack: Stack,
    runs: Mapping[str, list[WorkflowRun]],
    max_tokens: int,
    key: AnswerKey,
    tick_s: float,
    snapshot: bool = False,
) -> None:
    total = sum(len(r) for r in runs.values())
    finished: list[WorkflowRun] = []
    t0 = time.monotonic()

    def heard(arm: str) -> Callable[[WorkflowRun], None]:
        def on_done(run: WorkflowRun) -> None:
            finished.append(run)
            console.print(done_line(arm, run, len(finished), total))

        return on_done

    jobs = [
        run_workflows(stack.dispatcher_addr, arm_runs_, len(arm_runs_), max_tokens, key, heard(name))
        for name, arm_runs_ in runs.items()
    ]
    work = asyncio.ensure_future(asyncio.gather(*jobs))
    watchers = [asyncio.create_task(print_queue_snapshot(console, stack, work))] if snapshot else []
    while not work.done():
        await asyncio.wait([work], timeout=tick_s)
        if not work.done():
            console.print(
                f"  ... {len(finished)}/{total} done, {total - len(finished)} running or queued"
                f" ({time.monotonic() - t0:.0f} s)"
            )
    await work
    for w in watchers:
        await w
