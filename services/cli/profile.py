"""``chimera profile``: measure an engine's decode speed and batch limit, and publish it.

The same code runs as the Celery task ``profile_engine`` (services/jobs); from the CLI it shows progress.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from services.common.keys import Keys
from services.common.types import EngineProfile

console = Console(width=160)


def profile(
    engine_id: Annotated[str, typer.Option(help="engine id the profile is stored under")],
    model: Annotated[str, typer.Option(help="model name the engine reports")],
    kind: Annotated[str, typer.Option(help="vllm | remote | simulated")] = "vllm",
    model_path: Annotated[
        str,
        typer.Option(
            help="vllm: folder or tiny|small|smollm2|gemma3-270m|qwen2.5-coder-0.5b|qwen2.5-coder-1.5b"
        ),
    ] = "tiny",
    remote_url: Annotated[str, typer.Option(help="remote: server base URL")] = "",
    max_num_seqs: Annotated[int, typer.Option(help="largest batch measured")] = 16,
    tokens: Annotated[int, typer.Option(help="max tokens per request while measuring")] = 64,
    rounds: Annotated[int, typer.Option(help="repeats per batch size (median kept)")] = 2,
    redis_url: Annotated[str | None, typer.Option(help="store the profile in this Redis")] = None,
    key_prefix: str = "chimera",
    out: Annotated[Path, typer.Option(help="also write <engine_id>.json here")] = Path(".chimera/profiles"),
) -> None:
    """Profile one engine at increasing batch sizes; store decode_ms_per_token, max_batch_size and the
    step-time curve in Redis (when --redis-url is given) and in a JSON file."""
    from services.jobs.profile import profile_and_store
    from services.launcher.cores import available_cores, thread_plan
    from services.launcher.stack import CPU_VLLM_ENV
    from services.worker.profiling import ProfileProgress

    if kind == "vllm":
        # What the launcher gives a CPU vLLM worker alone on the machine: every core this process may use.
        threads = thread_plan([engine_id], available_cores())[engine_id]
        for name, value in {**CPU_VLLM_ENV, **threads}.items():
            os.environ.setdefault(name, value)

    worker: dict[str, Any] = {
        "engine_id": engine_id,
        "model": model,
        "engine_kind": kind,
        "model_path": model_path,
        "remote_url": remote_url,
        "max_num_seqs": max_num_seqs,
    }
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task(f"starting {engine_id}", total=None)

        def on_progress(p: ProfileProgress) -> None:
            bar.update(
                task,
                total=p.total,
                completed=p.done,
                description=f"batch {p.batch_size}: {p.step_ms:.1f} ms/step",
            )

        result: EngineProfile = asyncio.run(
            profile_and_store(worker, redis_url, Keys(key_prefix), out, tokens, rounds, None, on_progress)
        )
    table = Table(title=f"profile of {engine_id} ({model})")
    table.add_column("batch")
    table.add_column("decode step ms")
    for b, ms in result.step_ms:
        table.add_row(str(b), f"{ms:.1f}")
    console.print(table)
    console.print(
        f"decode_ms_per_token={result.decode_ms_per_token:.1f} max_batch_size={result.max_batch_size} "
        f"prefill_ms_per_token={result.prefill_ms_per_token:.3f}; written to {out / (engine_id + '.json')}"
        + (f" and {Keys(key_prefix).profile(engine_id)}" if redis_url else "")
    )
