"""``chimera collect``: real traces and verified outcomes from a real pool (see services/collect/)."""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from services.common.logs import setup_logging

if TYPE_CHECKING:
    from services.launcher.pool import PoolSpec
    from services.verify.answers import AnswerKey
    from services.workload.corpus import Problem

DATASET = Path("bench/data/real")
AGENT_DATASET = Path("bench/data/agent")


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt  # SIGTERM like Ctrl-C: the last export runs and the stack's children stop


def collect(
    pool: Annotated[Path, typer.Option(help="pool YAML or embedded pool name")] = Path("qwen-coder-3"),
    model: Annotated[
        list[str] | None,
        typer.Option(help="engine id or model name of the pool to run (repeat); default all"),
    ] = None,
    source: Annotated[
        list[str] | None,
        typer.Option(help="corpus source (repeat): humaneval leetcode champ euler gsm; default all five"),
    ] = None,
    tasks: Annotated[int, typer.Option(help="tasks per source (the plan's first N; more extends it)")] = 20,
    seed: Annotated[int, typer.Option(help="seed of each source's task order")] = 0,
    max_tokens: Annotated[int, typer.Option(help="max tokens per stage")] = 512,
    concurrency: Annotated[int, typer.Option(help="workflows in flight per engine")] = 4,
    out: Annotated[Path, typer.Option(help="dataset folder (committed)")] = DATASET,
    state_dir: Annotated[Path, typer.Option(help="private Redis, logs, raw export")] = Path(
        ".chimera/collect"
    ),
    pin_cores: Annotated[bool, typer.Option(help="pin each engine's worker to its own core")] = True,
    agent: Annotated[
        bool,
        typer.Option(
            help="collect the coding agent's loops instead (services/agent): HumanEval and LeetCode by"
            " default, one JSON line per loop in OUT/loops.jsonl (OUT defaults to bench/data/agent)"
        ),
    ] = False,
    max_turns: Annotated[int, typer.Option(help="the coding agent's turn limit (with --agent)")] = 4,
) -> None:
    """Run the paper's workflows on each selected model of the pool through the live stack, verify every
    answer, export traces and outcomes with the product's export into OUT (texts kept only where their
    license allows). With --agent, the coding agent's loops. Resumable: what the dataset holds is skipped."""
    from services.collect.plan import CODE_SOURCES, DEFAULT_SOURCES, plan_tasks
    from services.collect.runner import CollectPlan, select_engines
    from services.collect.runner import collect as run_collection
    from services.launcher.pool import load_pool, resolve_pool
    from services.verify.answers import load_answer_key
    from services.workload.corpus import load_corpus

    setup_logging("collect")
    signal.signal(signal.SIGTERM, _interrupt)
    logging.getLogger("services").setLevel(logging.INFO)
    sources = tuple(source or (CODE_SOURCES if agent else DEFAULT_SOURCES))
    corpus = load_corpus(use_fallback=False)
    key = load_answer_key(sources=sources)
    plan = plan_tasks(corpus.problems, lambda pid: key.get(pid) is not None, sources, tasks, seed)
    pool_file = resolve_pool(pool)
    engines = select_engines(load_pool(pool_file), model or [])
    if agent:
        _collect_agent(engines, [t.problem for t in plan], key, pool_file, state_dir, max_turns, max_tokens,
                       concurrency, out if out != DATASET else AGENT_DATASET)  # fmt: skip
        return
    settings = CollectPlan(out, state_dir, max_tokens, concurrency, pin_cores)
    counts = run_collection(settings, engines, plan, key, pool_file)
    typer.echo(f"dataset {out}: {counts}")
    typer.echo((out / "summary.json").read_text() if (out / "summary.json").exists() else json.dumps({}))


def _collect_agent(
    engines: PoolSpec,
    problems: list[Problem],
    key: AnswerKey,
    pool_file: Path,
    state_dir: Path,
    max_turns: int,
    max_tokens: int,
    concurrency: int,
    out: Path,
) -> None:
    from services.agent.collect import AgentPlan, collect_loops
    from services.collect.runner import select_engines

    able = list(engines.tool_models)
    if not able:
        raise typer.BadParameter("none of these engines can call tools (tool_parser in the pool file)")
    pool = select_engines(engines, able)
    plan = AgentPlan(out, state_dir / "agent", max_turns, max_tokens, concurrency)
    n = collect_loops(plan, pool, problems, key, pool_file)
    typer.echo(f"dataset {out}: {n} loops")
