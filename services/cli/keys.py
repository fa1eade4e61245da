"""``chimera keys create|list|revoke``: API keys, each bound to one tenant (``services.common.apikeys``)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from services.common.apikeys import ApiKeyStore, InvalidTenant, IssuedKey
from services.common.config import CommonSettings
from services.common.keys import Keys
from services.common.redis_client import connect_tool

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
console = Console(width=160)
T = TypeVar("T")


def _run(work: Callable[[ApiKeyStore], Awaitable[T]]) -> T:
    settings = CommonSettings()

    async def go() -> T:
        redis = connect_tool(settings.redis_url)
        try:
            return await work(ApiKeyStore(redis, Keys(settings.key_prefix)))
        finally:
            await redis.aclose()

    return asyncio.run(go())


def _when(unix: float | None) -> str:
    return "" if unix is None else dt.datetime.fromtimestamp(unix, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


@app.command()
def create(
    tenant: Annotated[str, typer.Option(help="the tenant the key acts for (a-z 0-9 _ -)")],
    name: Annotated[str, typer.Option(help="what the key is for, shown by `list`")] = "",
    out: Annotated[
        Path | None, typer.Option(help="write the key to this file (mode 0600) instead of printing it")
    ] = None,
    first: Annotated[
        bool, typer.Option("--first", help="only if no key exists yet (a deployment's bootstrap)")
    ] = False,
) -> None:
    """Create a key for TENANT. The key is shown once: only its hash is kept."""

    async def make(store: ApiKeyStore) -> IssuedKey | None:
        if first and await store.list():
            return None
        return await store.create(tenant, name)

    try:
        issued = _run(make)
    except (InvalidTenant, ValueError) as e:
        console.print(f"[red]{e}[/]")
        raise typer.Exit(2) from e
    if issued is None:
        console.print("keys exist already; none created (--first)")
        return
    if out is None:
        typer.echo(issued.token)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.touch(mode=0o600, exist_ok=True)
        out.write_text(issued.token + "\n")
        console.print(f"key {issued.record.key_id} for tenant {tenant} written to {out}", highlight=False)


@app.command("list")
def list_keys(as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
    """Every key's id, tenant, name, creation and revocation time (never the key)."""
    records = _run(lambda store: store.list())
    if as_json:
        typer.echo(json.dumps([{k: v for k, v in asdict(r).items() if k != "digest"} for r in records]))
        return
    table = Table(title="API keys", title_justify="left")
    for col in ("key id", "tenant", "name", "created", "revoked"):
        table.add_column(col)
    for r in records:
        table.add_row(r.key_id, r.tenant, r.name, _when(r.created_unix), _when(r.revoked_unix))
    console.print(table)


@app.command()
def revoke(key_id: Annotated[str, typer.Argument(help="the key id `list` shows")]) -> None:
    """Revoke a key: refused by every dispatcher within its auth_cache_s."""
    record = _run(lambda store: store.revoke(key_id))
    if record is None:
        console.print(f"[red]no key {key_id}[/]")
        raise typer.Exit(1)
    console.print(f"key {key_id} of tenant {record.tenant} revoked at {_when(record.revoked_unix)}")
