"""What the demo prints: a queue snapshot taken mid-run and a per-workflow table with each verified score."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from services.common.keys import Keys, RequestField
from services.common.redis_client import connect_tool
from services.demo.client import WorkflowRun
from services.launcher.stack import Stack


async def print_queue_snapshot(console: Console, stack: Stack, until: asyncio.Task[object]) -> None:
    """Once some engine has a queue, print it as ``redis-cli ZRANGE <queue> 0 -1 WITHSCORES`` would."""
    keys = Keys(stack.key_prefix)
    client = connect_tool(stack.redis_url)
    try:
        while not until.done():
            for e in stack.pool.engines:
                entries: Any = await client.zrange(keys.queue(e.id), 0, -1, withscores=True)
                if len(entries) >= 3:
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
