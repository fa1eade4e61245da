"""The launcher supervises its private Redis like every other child: killed outright, redis-server is
restarted on the same socket and data folder, comes back with what it held (its append-only file), and the
stack answers again."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from services.common.keys import Keys
from services.demo.client import run_demo
from services.launcher.config import LauncherSettings
from services.launcher.pool import EngineSpec, PoolSpec
from services.launcher.stack import Stack, running_stack
from services.launcher.supervisor import Child
from services.workload.corpus import embedded_corpus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    engine = EngineSpec(
        id="sim",
        model="Qwen/Qwen2.5-1.5B-Instruct",
        kind="simulated",
        max_num_seqs=4,
        env={"time_scale": "10"},
    )
    with running_stack(LauncherSettings.ephemeral(tmp_path), PoolSpec(engines=(engine,))) as s:
        yield s


def _child(stack: Stack, name: str) -> Child:
    return next(c for c in stack.supervisor.children if c.name == name)


def _eventually(cond: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f}s: {what}"
        time.sleep(0.2)


def test_a_killed_redis_is_restarted_with_its_data(stack: Stack) -> None:
    keys = Keys(stack.key_prefix)
    before = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    before.set(f"{stack.key_prefix}:survivor", "still here")
    engines = before.smembers(keys.engines())
    before.close()
    assert engines == {"sim"}, "the worker registered its engine"
    time.sleep(1.5)  # past appendfsync everysec

    server = _child(stack, "redis")
    assert server.proc is not None
    killed = server.proc.pid
    os.kill(killed, signal.SIGKILL)
    _eventually(lambda: server.restarts >= 1 and server.probe(), 30, "redis restarted by the supervisor")
    assert server.proc.pid != killed
    assert stack.redis_url == f"unix://{stack.state_dir / 'redis' / 'redis.sock'}", "same socket as before"

    after = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        assert after.get(f"{stack.key_prefix}:survivor") == "still here"
        assert after.smembers(keys.engines()) == engines
    finally:
        after.close()
    # Services that died with Redis gone are restarted too; all of them answer their health probes again.
    _eventually(
        lambda: all(c.alive() and c.probe() for c in stack.supervisor.children), 45, "every child healthy"
    )
    runs = asyncio.run(
        asyncio.wait_for(
            run_demo(stack.dispatcher_addr, embedded_corpus().problems, 2, 2, max_tokens=16, seed=3), 45
        )
    )
    assert [r.error for r in runs if not r.completed] == []
