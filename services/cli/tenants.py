"""``chimera tenants set|show|list|clear``: per-tenant quotas and fair-share weights (``common.tenants``).

A field left unset takes the dispatcher's default (``CHIMERA_DISPATCHER_TENANT_*``); 0 means unlimited.
Dispatchers see a change within their ``auth_cache_s``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from services.common.apikeys import InvalidTenant
from services.common.keys import Keys
from services.common.redis_client import connect_tool
from services.common.tenants import TenantLimits, TenantStore, Usage
from services.dispatcher.config import DispatcherSettings

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
console = Console(width=160)
T = TypeVar("T")


def _run(work: Callable[[TenantStore], Awaitable[T]]) -> T:
    settings = DispatcherSettings()

    async def go() -> T:
        redis = connect_tool(settings.redis_url)
        try:
            return await work(TenantStore(redis, Keys(settings.key_prefix)))
        finally:
            await redis.aclose()

    return asyncio.run(go())


def _effective(record: TenantLimits | None) -> TenantLimits:
    return (record or TenantLimits()).over(DispatcherSettings().tenant_defaults())


@app.command("set")
def set_(
    tenant: Annotated[str, typer.Argument(help="the tenant (as its API keys name it)")],
    max_workflows: Annotated[
        int | None, typer.Option(min=0, help="live workflows at once; a new one past it gets 429 (0: none)")
    ] = None,
    tokens_per_minute: Annotated[
        int | None, typer.Option(min=0, help="prompt + max_tokens charged over a sliding minute (0: none)")
    ] = None,
    weight: Annotated[int | None, typer.Option(min=1, max=1000, help="fair-share weight")] = None,
    models: Annotated[
        str | None, typer.Option(help="comma-separated models it may use (others: 403); unset: all")
    ] = None,
) -> None:
    """Set some of TENANT's quotas; the others keep their value (or the default)."""
    try:
        allowed = None if models is None else tuple(m.strip() for m in models.split(",") if m.strip())
        change = TenantLimits(max_workflows, tokens_per_minute, weight, allowed)
        record = _run(lambda store: store.set(tenant, change))
    except (InvalidTenant, ValueError) as e:
        console.print(f"[red]{e}[/]")
        raise typer.Exit(2) from e
    console.print(
        f"tenant {tenant}: {record.to_json()} (in force: {asdict(_effective(record))})", highlight=False
    )


@app.command()
def show(tenant: Annotated[str, typer.Argument(help="the tenant")]) -> None:
    """TENANT's quotas as set, as in force (with the defaults), and what it holds now."""

    async def read(store: TenantStore) -> tuple[TenantLimits | None, Usage]:
        return await store.get(tenant), await store.usage(tenant, time.time())

    record, usage = _run(read)
    typer.echo(
        json.dumps(
            {
                "tenant": tenant,
                "set": None if record is None else json.loads(record.to_json()),
                "in_force": asdict(_effective(record)),
                "usage": asdict(usage),
            }
        )
    )


@app.command("list")
def list_(as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
    """Every tenant with quotas of its own (the others get the defaults)."""
    records = _run(lambda store: store.all())
    if as_json:
        typer.echo(json.dumps({t: asdict(_effective(r)) for t, r in records.items()}))
        return
    table = Table(title="tenant quotas (in force; * set for the tenant)", title_justify="left")
    for col in ("tenant", "max workflows", "tokens per minute", "weight"):
        table.add_column(col)
    for t, r in records.items():
        e = _effective(r)
        table.add_row(
            t,
            f"{e.max_workflows}{'*' * (r.max_workflows is not None)}",
            f"{e.tokens_per_minute}{'*' * (r.tokens_per_minute is not None)}",
            f"{e.weight}{'*' * (r.weight is not None)}",
        )
    console.print(table)


@app.command()
def clear(tenant: Annotated[str, typer.Argument(help="the tenant")]) -> None:
    """Drop TENANT's own quotas: it gets the defaults again."""
    if not _run(lambda store: store.clear(tenant)):
        console.print(f"tenant {tenant} had no quotas of its own")
