"""What the demo prints: a line per workflow as it finishes, a queue snapshot taken mid-run, a per-workflow
table with each verified score, and the summary that puts Chimera's choice beside each model alone."""

from __future__ import annotations

import asyncio
import json
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from services.common.keys import Keys, RequestField
from services.common.redis_client import connect_tool
from services.demo.client import WorkflowRun
from services.launcher.stack import Stack


async def print_queue_snapshot(console: Console, stack: Stack, until: asyncio.Future[Any]) -> None:
    """Once some engine has a queue, print it as ``redis-cli ZRANGE <queue> 0 -1 WITHSCORES`` would."""
    keys = Keys(stack.key_prefix)
    client = connect_tool(stack.redis_url)
    try:
        while not until.done():
            for e in stack.pool.engines:
                entries: Any = await client.zrange(keys.queue(e.id), 0, -1, withscores=True)
                if len(entries) >= 2:
                    table = Table(title=f"ZRANGE '{keys.queue(e.id)}' 0 -1 WITHSCORES (dispatch order)")
                    for col in ("pos", "request", "score", "predicted tokens", "stage"):
                        table.add_column(col)
                    for pos, (rid, score) in enumerate(entries[:10]):
                        y, payload = await client.hmget(
                            keys.request(e.id, rid), [RequestField.Y, RequestField.PAYLOAD]
                        )
                        stage_idx = "?" if payload is None else str(json.loads(payload)["stage"])
                        table.add_row(str(pos), rid[:16], f"{score:.1f}", str(y), stage_idx)
                    console.print(table)
                    return
            await asyncio.sleep(0.05)
    finally:
        await client.aclose()


def _score(run: WorkflowRun) -> str:
    """The verified score, and why it is 0; "-" when the problem has no check (or the run failed)."""
    v = run.verdict
    if v is None:
        return "-"
    return f"{v.score:.0f}" if v.passed else f"{v.score:.0f} ({v.detail[:40]})"


def score_summary(runs: Sequence[WorkflowRun]) -> str:
    """One line: the mean verified score per domain over the workflows that have one."""
    parts = []
    for domain in ("code", "math"):
        scored = [r.verdict.score for r in runs if r.verdict is not None and r.workflow.domain == domain]
        if scored:
            parts.append(f"{domain} {sum(scored) / len(scored):.2f} ({int(sum(scored))}/{len(scored)})")
    if not parts:
        return "verified score: no workflow had a verifiable problem"
    return "verified score (sent with EndProgram as the outcome): " + ", ".join(parts)


def print_report(console: Console, runs: Sequence[WorkflowRun]) -> int:
    table = Table(title="workflows")
    for col in (
        "program",
        "workflow",
        "model",
        "engine",
        "stages",
        "queue wait s",
        "tokens",
        "e2e s",
        "score",
        "status",
    ):
        table.add_column(col)
    for r in runs:
        models = sorted({s.model.rsplit("/", 1)[-1] for s in r.stages}) or ["-"]
        engines = sorted({s.engine for s in r.stages}) or ["-"]
        table.add_row(
            r.program_id,
            r.workflow.name,
            ",".join(models),
            ",".join(engines),
            f"{len(r.stages)}/{r.workflow.n_stages}",
            f"{sum(s.queue_wait_s for s in r.stages):.2f}",
            str(sum(s.completion_tokens for s in r.stages)),
            f"{r.e2e_s:.2f}",
            _score(r),
            "ok" if r.completed else f"[red]{r.error}[/]",
        )
    console.print(table)
    for r in [r for r in runs if r.completed][:2]:
        last = r.stages[-1]
        text = " ".join(last.text.split())[:300]
        console.print(
            f"[bold]{r.workflow.name}[/] final stage answered by {last.model} on {last.engine}: {text!r}"
        )
    console.print(score_summary(runs))
    done = sum(r.completed for r in runs)
    console.print(f"workflows completed: {done}/{len(runs)}")
    return len(runs) - done


def _short(model: str) -> str:
    return model.rsplit("/", 1)[-1]


def done_line(arm: str, run: WorkflowRun, done: int, total: int) -> str:
    """``[3/8] chimera humaneval/12 -> Qwen2.5-Coder-0.5B-Instruct: 412 tokens, 63.1 s, passed``."""
    models = ",".join(sorted({_short(s.model) for s in run.stages})) or "-"
    tokens = sum(s.completion_tokens for s in run.stages)
    if not run.completed:
        verdict = f"[red]failed: {escape(str(run.error))}[/]"
    elif run.verdict is None:
        verdict = "not checked"
    else:
        verdict = "[green]passed[/]" if run.verdict.passed else "wrong"
    head = f"  [{done}/{total}] {escape(arm)} {run.problem.id} -> {models}"
    return f"{head}: {tokens} tokens, {run.e2e_s:.1f} s, {verdict}"


def print_arms(console: Console, arms: Mapping[str, Sequence[WorkflowRun]]) -> None:
    """The closing summary: per arm, on the same tasks, the verified score and the end-to-end times."""
    table = Table(title="the same tasks: Chimera's choice beside each model alone")
    for col in ("arm", "completed", "verified score", "mean e2e s", "median e2e s", "served by"):
        table.add_column(col)
    for name, runs in arms.items():
        done = [r for r in runs if r.completed]
        scored = [r.verdict.score for r in done if r.verdict is not None]
        times = [r.e2e_s for r in done]
        served = Counter(_short(s.model) for r in done for s in r.stages)
        table.add_row(
            name,
            f"{len(done)}/{len(runs)}",
            f"{sum(scored) / len(scored):.2f} ({int(sum(scored))}/{len(scored)})" if scored else "-",
            f"{statistics.fmean(times):.1f}" if times else "-",
            f"{statistics.median(times):.1f}" if times else "-",
            ", ".join(f"{m} {n}" for m, n in served.most_common()) or "-",
        )
    console.print(table)
