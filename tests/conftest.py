"""Shared fixtures. Tests never touch a Redis they did not start: each session gets a private
``redis-server`` on a Unix socket, and each test a unique key prefix."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from worker_procs import Spawner

from services.common.keys import Keys
from services.common.redis_client import connect_tool
from services.common.redis_proc import PrivateRedis, start_private_redis


@pytest.fixture(scope="session")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRedis]:
    server = start_private_redis(Path(tmp_path_factory.mktemp("redis")))
    yield server
    server.stop()


@pytest.fixture
def keys() -> Keys:
    return Keys(prefix=f"t{uuid.uuid4().hex[:10]}")


@pytest.fixture
async def redis_client(private_redis: PrivateRedis) -> AsyncIterator[Redis]:
    client = connect_tool(private_redis.url)  # the product's client (cancel-safe: services.common.redis_conn)
    yield client
    await client.aclose()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawner]:
    """Starts ``python -m services.worker`` processes; kills those still running after the test."""
    spawner = Spawner(tmp_path)
    yield spawner
    spawner.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The fuzzers' counts (``record_property("fuzz", ...)``), shown in every run's summary, -q included."""
    lines = [
        str(value)
        for outcome in ("passed", "failed")
        for report in terminalreporter.getreports(outcome)
        for name, value in report.user_properties
        if name == "fuzz"
    ]
    if lines:
        terminalreporter.write_sep("-", "fuzz")
        for line in lines:
            terminalreporter.write_line(line)
