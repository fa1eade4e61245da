"""``chimera collect --agent``: the coding agent's loops on each model of a real pool, through the live
stack's OpenAI door, verified, one JSON line per loop.

One stack (``running_stack``: private Redis in the state folder, router, predictor, one worker per engine,
dispatcher) is started on the pool's engines that can call tools. Each pending (engine, problem) runs as
the agent runs (``services.agent.coding.run_agent``: the model pinned, no Chimera header, a ``run_tests``
call per turn until the tests pass or ``max_turns``), and its record goes to ``loops.jsonl`` in the dataset
folder as soon as it ends: the turns, each turn's tokens, timings and the tool's verdict (whether it failed,
how long its report was), the verified outcome. That is what a predictor of an open loop's remaining work
learns from (the turn index, the tokens so far, the last tool result). What the file already holds is
skipped, so a killed collection loses at most the loops in flight and a rerun carries on.

Only ids, lengths, timings and outcomes are written, never a problem's or a model's text: LeetCode's texts
are not ours to publish (``services.collect.plan.PUBLISHABLE_TEXT``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

from services.agent.coding import AgentRun, end_loop, run_agent
from services.agent.run_tests import code_check
from services.launcher.config import LauncherSettings
from services.launcher.pool import EngineSpec, PoolSpec
from services.launcher.stack import running_stack
from services.verify.answers import AnswerKey
from services.workload.corpus import Problem

log = logging.getLogger(__name__)
KEY_PREFIX = "collect-agent"
LOOPS = "loops.jsonl"
SUMMARY = "summary.json"


@dataclass(frozen=True, slots=True)
class AgentPlan:
    out: Path  # the dataset folder (committed): loops.jsonl
    state_dir: Path  # private Redis, artifacts, logs (not committed)
    max_turns: int = 4
    max_tokens: int = 512  # per turn
    concurrency: int = 2  # loops in flight per engine


def collected(out: Path) -> set[tuple[str, str]]:
    """(engine, problem id) of every loop ``out`` holds."""
    path = out / LOOPS
    if not path.exists():
        return set()
    done = set()
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            done.add((str(row["engine"]), str(row["problem_id"])))
    return done


def _cached_share(turns: Sequence[dict[str, Any]]) -> float:
    prompt = sum(int(t["prompt_tokens"]) for t in turns)
    return round(sum(int(t.get("cached_tokens", 0)) for t in turns) / prompt, 4) if prompt else 0.0


def summarise(out: Path) -> dict[str, dict[str, float]]:
    """Per engine: loops, verified pass rate, how many passed on the first submission and how many only
    after a failed test run (what the tool bought), mean turns and end-to-end seconds. Written beside the
    loops as ``summary.json``."""
    path = out / LOOPS
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    summary: dict[str, dict[str, float]] = {}
    for engine in sorted({r["engine"] for r in rows}):
        mine = [r for r in rows if r["engine"] == engine]
        first = sum(r["passed"] and r["n_turns"] == 1 for r in mine)
        passed = sum(bool(r["passed"]) for r in mine)
        summary[engine] = {
            "loops": len(mine),
            "pass_rate": round(passed / len(mine), 4),
            "passed_first_turn": first,
            "passed_after_a_failure": passed - first,
            "mean_turns": round(sum(r["n_turns"] for r in mine) / len(mine), 3),
            "mean_e2e_s": round(sum(r["e2e_s"] for r in mine) / len(mine), 2),
            # What staying on the engine across a tool call saved: of the prompt tokens of every turn after
            # a tool result, the share the engine's prefix cache held (vLLM's own count).
            "cached_share_after_a_tool": _cached_share([t for r in mine for t in r.get("turns", [])[1:]]),
        }
    (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def record(run: AgentRun, engine: EngineSpec, started: float, plan: AgentPlan) -> dict[str, object]:
    """A loop's line: the agent's own record, where and how it ran."""
    return {
        **run.record(),
        "engine": engine.id,
        "started_unix": round(started, 3),
        "max_turns": plan.max_turns,
        "max_tokens": plan.max_tokens,
        "concurrency": plan.concurrency,
    }


async def run_loops(
    http_url: str,
    todo: Sequence[tuple[EngineSpec, Problem]],
    key: AnswerKey,
    plan: AgentPlan,
    on_done: Callable[[AgentRun, EngineSpec, float], None],
) -> int:
    """Run ``todo``, ``plan.concurrency`` loops at a time per engine; returns how many ended without an
    error (``on_done`` hears of those, one at a time)."""
    limits = {e.id: asyncio.Semaphore(plan.concurrency) for e, _ in todo}
    finished = 0
    async with openai.AsyncOpenAI(
        base_url=f"{http_url}/v1", api_key="unused", max_retries=0, timeout=3600
    ) as c:

        async def one(engine: EngineSpec, problem: Problem) -> None:
            nonlocal finished
            check = code_check(key, problem.id)
            async with limits[engine.id]:
                started = time.time()
                run = await run_agent(
                    c,
                    problem,
                    check,
                    model=engine.model,
                    max_turns=plan.max_turns,
                    max_tokens=plan.max_tokens,
                )
                await end_loop(c, run)
            if run.error:
                log.warning("%s on %s: %s", problem.id, engine.id, run.error)
                return
            on_done(run, engine, started)
            finished += 1

        await asyncio.gather(*(one(e, p) for e, p in todo))
    return finished


def collect_loops(
    plan: AgentPlan, pool: PoolSpec, problems: Sequence[Problem], key: AnswerKey, pool_file: Path | None
) -> int:
    """Run every (engine, problem) loop ``plan.out`` lacks; returns the loops the file holds."""
    done = collected(plan.out)
    todo = [(e, p) for p in problems for e in pool.engines if (e.id, p.id) not in done]
    log.info(
        "%d problems x %d engines: %d loops held, %d to run",
        len(problems),
        len(pool.engines),
        len(done),
        len(todo),
    )
    if not todo:
        summarise(plan.out)
        return len(done)
    plan.out.mkdir(parents=True, exist_ok=True)
    settings = LauncherSettings.ephemeral(
        plan.state_dir, key_prefix=KEY_PREFIX, pool_file=pool_file, start_timeout_s=1800.0
    )
    with running_stack(settings, pool) as stack, (plan.out / LOOPS).open("a") as f:

        def on_done(run: AgentRun, engine: EngineSpec, started: float) -> None:
            f.write(json.dumps(record(run, engine, started, plan)) + "\n")
            f.flush()
            log.info(
                "%s on %s: %s after %d turns, %.1f s",
                run.problem_id,
                engine.id,
                "passed" if run.passed else "failing",
                len(run.turns),
                run.e2e_s,
            )

        t0 = time.monotonic()
        n = asyncio.run(run_loops(f"http://{stack.http_addr}", todo, key, plan, on_done))
        log.info("ran %d loops in %.0f s", n, time.monotonic() - t0)
    summarise(plan.out)
    return len(collected(plan.out))
