"""``chimera train router|predictor``: fit a new artifact version from traces and make it current.

Running services hot-reload it (they watch ``CURRENT``), so retraining never restarts anything.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from services.common.keys import Keys
from services.common.redis_client import connect_tool
from services.common.tracestore import read_outcomes_redis, read_trace_folder, read_traces_redis
from services.common.types import OutcomeRow, TraceRow

app = typer.Typer(no_args_is_help=True, help=__doc__)
console = Console(width=160)

TracesOpt = Annotated[
    Path | None,
    typer.Option("--traces", help="folder of traces*.jsonl and outcomes.jsonl (exported or generated)"),
]
RedisOpt = Annotated[
    str | None, typer.Option("--redis-url", help="read the live system's trace streams from this Redis")
]
ArtifactsOpt = Annotated[Path, typer.Option("--artifacts", help="artifacts root shared by both services")]
BackendOpt = Annotated[str | None, typer.Option("--backend", help="backend name (default: the best one)")]


def _load(
    traces_dir: Path | None, redis_url: str | None, prefix: str
) -> tuple[list[TraceRow], list[OutcomeRow]]:
    if (traces_dir is None) == (redis_url is None):
        raise typer.BadParameter("give exactly one of --traces or --redis-url")
    if traces_dir is not None:
        return read_trace_folder(traces_dir)

    async def from_redis() -> tuple[list[TraceRow], list[OutcomeRow]]:
        client = connect_tool(str(redis_url))
        try:
            keys = Keys(prefix)
            return await read_traces_redis(client, keys), await read_outcomes_redis(client, keys)
        finally:
            await client.aclose()

    return asyncio.run(from_redis())


def _progress() -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console)


def _train(
    kind: str, traces: Path | None, redis_url: str | None, prefix: str, root: Path, backend: str | None
) -> None:
    """Read the rows, fit ``kind`` with its training module (imported only here: it pulls in sklearn/torch),
    publish the new version and show its held-out metrics."""
    with _progress() as progress:
        task = progress.add_task("reading traces", total=None)
        rows, outcomes = _load(traces, redis_url, prefix)
        kwargs: dict[str, Any] = {"backend": backend} if backend else {}
        if kind == "router":
            from services.router.training import train_router

            progress.update(task, description=f"training on {len(outcomes)} workflows ({len(rows)} stages)")
            meta = train_router(rows, outcomes, root, **kwargs)
        else:
            from services.predictor.training import train_predictor

            progress.update(task, description=f"training on {len(rows)} stages")
            meta = train_predictor(rows, root, **kwargs)
    console.print(f"{kind} {meta.version} ({meta.backend}) is current; held-out metrics:")
    console.print_json(data=meta.metrics)


@app.command()
def router(
    traces: TracesOpt = None,
    redis_url: RedisOpt = None,
    key_prefix: str = "chimera",
    artifacts: ArtifactsOpt = Path(".chimera/artifacts"),
    backend: BackendOpt = None,
) -> None:
    """Train the router (per-model success confidence) from traces joined with workflow outcomes."""
    _train("router", traces, redis_url, key_prefix, artifacts, backend)


@app.command()
def predictor(
    traces: TracesOpt = None,
    redis_url: RedisOpt = None,
    key_prefix: str = "chimera",
    artifacts: ArtifactsOpt = Path(".chimera/artifacts"),
    backend: BackendOpt = None,
) -> None:
    """Train the length predictor (remaining workflow tokens) from stage traces."""
    _train("predictor", traces, redis_url, key_prefix, artifacts, backend)
