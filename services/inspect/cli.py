"""``chimera queue [ENGINE]`` and ``chimera explain REQUEST_ID``: Redis-only views, as rich tables or JSON."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Annotated, TypeVar

import typer
from redis.asyncio import Redis
from rich.console import Console
from rich.table import Table

from services.common.keys import Keys
from services.common.redis_client import connect_tool
from services.common.tenant_ids import tenant_of
from services.inspect.config import InspectSettings
from services.inspect.explain import COST_LABELS, Explanation, RequestNotFound, explain
from services.inspect.queue_view import EngineQueue, QueueView, WaitingRequest, queue_view

app = typer.Typer(add_completion=False, help=__doc__)
T = TypeVar("T")

JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of tables")]


def _run(settings: InspectSettings, work: Callable[[Redis, Keys], Awaitable[T]]) -> T:
    async def go() -> T:
        redis = connect_tool(settings.redis_url)
        try:
            return await work(redis, Keys(settings.key_prefix))
        finally:
            await redis.aclose()

    return asyncio.run(go())


def _ts(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.1f}m"


def _waiting_table(title: str, rows: tuple[WaitingRequest, ...]) -> Table:
    t = Table(title=title, title_justify="left")
    for col in (
        "pos",
        "tenant",
        "request",
        "program",
        "stage",
        "workflow",
        "pred tokens",
        "age",
        "eff. priority",
        "try",
    ):
        t.add_column(col, justify="right" if col in ("pos", "stage", "pred tokens", "age", "try") else "left")
    for w in rows:
        t.add_row(
            str(w.position),
            w.tenant,
            w.request_id,
            w.program_id,
            str(w.stage),
            w.workflow,
            f"{w.predicted_tokens} (p90 {w.predicted_tokens_p90})",
            _ts(w.age_s),
            f"{w.effective_priority:.1f}",
            str(w.attempt),
        )
    return t


def _engine_tables(console: Console, e: EngineQueue, bound_s: float) -> None:
    state = "[green]alive[/]" if e.alive else "[red]dead[/]"
    hb = f", heartbeat {_ts(e.heartbeat_age_s)} ago" if e.heartbeat_age_s is not None else ""
    full = f" of the {bound_s:g} s bound ({100 * e.work_s / bound_s:.0f}% full)" if bound_s > 0 else ""
    console.rule(
        f"[bold]{e.engine}[/] ({e.model or '?'}) {state}{hb}, in-flight {e.load_tokens} predicted tokens "
        f"= {e.work_s:.1f} s of work{full}"
    )
    more = f" (first {len(e.waiting)})" if e.waiting_total > len(e.waiting) else ""
    console.print(_waiting_table(f"waiting: {e.waiting_total}{more}, served top first", e.waiting))
    if not e.running:
        console.print("running: 0")
        return
    r = Table(title=f"running: {len(e.running)}", title_justify="left")
    for col in (
        "tenant",
        "request",
        "program",
        "stage",
        "workflow",
        "pred tokens",
        "worker",
        "running",
        "lease left",
        "try",
    ):
        r.add_column(col)
    for x in e.running:
        r.add_row(
            x.tenant,
            x.request_id,
            x.program_id,
            str(x.stage),
            x.workflow,
            str(x.predicted_tokens),
            x.worker,
            _ts(x.running_s),
            f"{x.lease_left_s:.1f}s",
            str(x.attempt),
        )
    console.print(r)


def render_queue(console: Console, view: QueueView, bound_s: float = 0.0) -> None:
    if not view.engines:
        console.print("no engine has registered")
    for e in view.engines:
        _engine_tables(console, e, bound_s)
    p = Table(title=f"programs: {len(view.programs)}", title_justify="left")
    for col in ("program", "workflow", "engine", "model", "stage", "request", "age", "idle", "ttl"):
        p.add_column(col)
    for x in view.programs:
        p.add_row(
            x.program_id,
            x.workflow,
            x.engine,
            x.model,
            str(x.stage),
            x.request_id,
            _ts(x.age_s),
            _ts(x.idle_s),
            f"{x.ttl_s}s",
        )
    console.print(p)


def _test(ok: bool | None) -> str:
    return "n/a" if ok is None else "pass" if ok else "fail"


def render_explanation(console: Console, e: Explanation) -> None:
    console.rule(f"[bold]{e.request_id}[/]: {e.state} on {e.engine} ({e.model})")
    console.print(
        f"tenant {tenant_of(e.program_id) or '(open)'}, program {e.program_id}, workflow {e.workflow}, "
        f"stage {e.stage}{f' (identity: {e.identity})' if e.identity else ''}; policy {e.policy}, "
        f"decision branch [bold]{e.branch}[/]; tau {e.tau:g}, delta_s {e.delta_s:g}"
    )
    if e.candidates:
        t = Table(title=f"why this model: policy {e.policy}'s scan", title_justify="left")
        for col in (
            "engine",
            "model",
            "q",
            COST_LABELS.get(e.cost_name, "cost"),
            "slack test",
            "margin test",
            "",
        ):
            t.add_column(col)
        for c in e.candidates:
            marks = " ".join(m for m, on in (("chosen", c.chosen), ("fastest", c.fastest)) if on)
            t.add_row(
                c.engine,
                c.model,
                f"{c.q:.3f}",
                f"{c.cost:.1f}",
                _test(c.slack_ok),
                _test(c.margin_ok),
                marks,
            )
        console.print(t)
    elif e.loads_ms:
        console.print(
            "loads at dispatch: " + ", ".join(f"{k} {v:.1f} ms" for k, v in sorted(e.loads_ms.items()))
        )
    for line in e.reasons:
        console.print(f"- {line}")
    console.print(
        f"priority: predicted {e.predicted_tokens} tokens (p90 {e.predicted_tokens_p90}), "
        f"score {e.score:.1f}, waited {_ts(e.age_s)}, effective priority {e.effective_priority:.1f}"
    )
    if e.ahead:
        console.print(_waiting_table(f"ahead of it ({e.position} in all; the nearest shown)", e.ahead))


@app.command()
def queue(
    engine: Annotated[str | None, typer.Argument(help="one engine id; default: every engine")] = None,
    limit: Annotated[int | None, typer.Option(help="waiting requests shown per engine")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Each engine's waiting requests in the order its workers will serve them, running requests, and the
    program table (reads Redis only)."""
    s = InspectSettings()
    view = _run(
        s,
        lambda r, k: queue_view(
            r,
            k,
            engine,
            limit=limit or s.limit,
            program_limit=s.program_limit,
            dead_after_s=s.engine_dead_after_s,
            now=time.time(),
        ),
    )
    if as_json:
        typer.echo(json.dumps(asdict(view), indent=2))
    else:
        render_queue(Console(), view, s.max_queue_s)


@app.command(name="explain")
def explain_cmd(
    request_id: Annotated[str, typer.Argument(help="the request to explain")],
    as_json: JsonOpt = False,
) -> None:
    """Why a request got its model (every engine's q and L, the slack and margin tests) and why it waits
    where it does (its score and the requests ahead of it)."""
    try:
        e = _run(InspectSettings(), lambda r, k: explain(r, k, request_id))
    except RequestNotFound as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(code=1) from exc
    if as_json:
        typer.echo(json.dumps(asdict(e), indent=2))
    else:
        render_explanation(Console(), e)
