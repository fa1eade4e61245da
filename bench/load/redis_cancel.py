"""redis-py's own connections against Chimera's cancel-safe ones (``services.common.redis_conn``).

Two figures, side by side on one private Redis (a Unix socket, as the launcher runs it):

- lost cancellations: of ``--tries`` tasks looping on GET, each cancelled at a random point, how many were
  still running half a second later (NOTE(cancel): Python 3.11's ``wait_for`` drops some);
- client CPU per command (GET, and a pipeline of HSET+HGET), alternated pairs, the ratio per pair: the
  cancel-safe write also skips the task ``wait_for`` creates for every write.

    python -m bench.load.redis_cancel            # -> bench/results/redis_cancel.{json,md}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics as st
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from redis.asyncio import ConnectionPool, Redis

from bench.common.paths import RESULTS
from services.common.redis_conn import cancel_safe
from services.common.redis_proc import start_private_redis

_KEY = "bench:redis-cancel"


def _client(url: str, safe: bool) -> Redis:
    pool = ConnectionPool.from_url(url, decode_responses=True)
    return Redis.from_pool(cancel_safe(pool) if safe else pool)


async def lost_cancellations(command: Callable[[], Awaitable[Any]], tries: int, seed: int) -> int:
    """Of ``tries`` tasks looping on ``command``, each cancelled at a random point (the write included), how
    many were still running half a second later (each is then cancelled until it stops)."""
    rng, lost = random.Random(seed), 0

    async def loop() -> None:
        while True:
            await command()

    for _ in range(tries):
        task = asyncio.create_task(loop())
        await asyncio.sleep(rng.random() * 0.003)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=0.5)
        if not done:
            lost += 1
            while not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=0.1)
    return lost


async def _lost(url: str, safe: bool, tries: int, seed: int) -> int:
    client = _client(url, safe)
    try:
        return await lost_cancellations(lambda: client.get(_KEY), tries, seed)
    finally:
        await client.aclose()


async def _cpu_us(url: str, safe: bool, op: str, n: int) -> float:
    """Client CPU-µs per operation over ``n`` sequential operations."""
    client = _client(url, safe)

    async def get() -> Any:
        return await client.get(_KEY)

    async def pipeline() -> Any:
        async with client.pipeline(transaction=False) as p:
            p.hset(_KEY + ":h", "n", 1)
            p.hget(_KEY + ":h", "n")
            return await p.execute()

    run: Callable[[], Awaitable[Any]] = get if op == "get" else pipeline
    await run()
    start = time.process_time()
    for _ in range(n):
        await run()
    cpu = time.process_time() - start
    await client.aclose()
    return cpu / n * 1e6


def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": round(st.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3)}


async def measure(url: str, tries: int, pairs: int, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "python": sys.version.split()[0],
        "lost_cancellations": {
            "tries": tries,
            "redis_py": await _lost(url, False, tries, 1),
            "cancel_safe": await _lost(url, True, tries, 1),
        },
        "cpu_us_per_op": {},
    }
    for op in ("get", "pipeline"):
        plain: list[float] = []
        safe: list[float] = []
        for i in range(pairs):  # alternate which runs first, so drift lands on both
            first, second = (False, True) if i % 2 == 0 else (True, False)
            a = await _cpu_us(url, first, op, n)
            b = await _cpu_us(url, second, op, n)
            (plain if not first else safe).append(a)
            (safe if second else plain).append(b)
        ratios = [s / p for s, p in zip(safe, plain, strict=True)]
        out["cpu_us_per_op"][op] = {
            "redis_py": _spread(plain),
            "cancel_safe": _spread(safe),
            "ratio_cancel_safe_over_redis_py": _spread(ratios),
        }
    return out


def report(r: dict[str, Any]) -> str:
    lost = r["lost_cancellations"]
    lines = [
        "# Cancelling a task mid-command: redis-py's connections against Chimera's cancel-safe ones",
        "",
        f"Python {r['python']}, one private Redis on a Unix socket, `python -m bench.load.redis_cancel` "
        f"({r['args']}).",
        "",
        f"**Lost cancellations** (a task looping on GET, cancelled at a random point, still running 0.5 s "
        f"later), of {lost['tries']}: redis-py {lost['redis_py']}, cancel-safe {lost['cancel_safe']}.",
        "",
        "**Client CPU-µs per operation**, median (min-max) over alternated pairs:",
        "",
        "| operation | redis-py | cancel-safe | cancel-safe / redis-py |",
        "|---|---|---|---|",
    ]
    for op, v in r["cpu_us_per_op"].items():
        cells = [v["redis_py"], v["cancel_safe"], v["ratio_cancel_safe_over_redis_py"]]
        shown = [f"{c['median']:.3g} ({c['min']:.3g}-{c['max']:.3g})" for c in cells]
        lines.append(f"| {op} | " + " | ".join(shown) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tries", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--ops", type=int, default=10_000, help="operations per measurement")
    ap.add_argument("--name", default="redis_cancel")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        redis = start_private_redis(Path(tmp))
        try:
            r = asyncio.run(measure(redis.url, a.tries, a.pairs, a.ops))
        finally:
            redis.stop()
    r["args"] = f"--tries {a.tries} --pairs {a.pairs} --ops {a.ops}"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{a.name}.json").write_text(json.dumps(r, indent=2) + "\n")
    (RESULTS / f"{a.name}.md").write_text(report(r))
    print(report(r))


if __name__ == "__main__":
    main()
