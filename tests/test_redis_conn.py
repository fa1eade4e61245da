"""Cancelling a task mid-command ends it: NOTE(cancel) in ``services.common.redis_conn``.

On Python 3.11, redis-py's own connections drop most such cancellations (the task runs on: 40-56 of 60 in
the first test below with the swap disabled); these tests cancel tasks looping on commands against a real
Redis and require every cancellation to land.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from redis.exceptions import TimeoutError as RedisTimeoutError

from bench.load.redis_cancel import lost_cancellations
from services.common import loop as event_loop
from services.common.keys import Keys
from services.common.redis_client import connect, connect_reader, connect_tool
from services.common.redis_conn import (
    CancelSafeConnection,
    CancelSafeSSLConnection,
    CancelSafeUnixConnection,
    cancel_safe_class,
)
from services.common.redis_proc import PrivateRedis

_TRIES = 60


@pytest.mark.redis
@pytest.mark.parametrize("factory", ["connect", "reader", "tool"])
async def test_every_cancellation_of_a_command_in_flight_ends_its_task(
    private_redis: PrivateRedis, keys: Keys, factory: str
) -> None:
    make = {"connect": lambda u: connect(u, 8), "reader": connect_reader, "tool": connect_tool}
    assert await _lost(make[factory](private_redis.url), keys.program("cancel-probe")) == (0, 0)


@pytest.mark.redis
def test_every_cancelled_command_ends_its_task_on_uvloop(private_redis: PrivateRedis, keys: Keys) -> None:
    """The services run on uvloop (``services.common.loop``): the same holds there."""

    async def on_uvloop() -> tuple[int, int]:
        assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
        return await _lost(connect(private_redis.url, 8), keys.program("uvloop-cancel-probe"))

    assert event_loop.run(on_uvloop(), "uvloop") == (0, 0)


async def _lost(client: Redis, key: str) -> tuple[int, int]:
    """Cancellations that did not end their task: of commands, then of pipelines; closes ``client``."""

    async def pipeline() -> None:
        async with client.pipeline(transaction=False) as p:
            p.hset(key, "n", 1)
            p.hget(key, "n")
            await p.execute()

    try:
        lost = (
            await lost_cancellations(lambda: client.get(key), _TRIES, 7),
            await lost_cancellations(pipeline, _TRIES, 7),
        )
        assert await client.ping()  # the connections a cancellation cut short were replaced
        return lost
    finally:
        await client.delete(key)
        await client.aclose()


def test_each_redis_py_connection_class_has_a_cancel_safe_counterpart() -> None:
    from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection

    assert cancel_safe_class(Connection) is CancelSafeConnection
    assert cancel_safe_class(SSLConnection) is CancelSafeSSLConnection
    assert cancel_safe_class(UnixDomainSocketConnection) is CancelSafeUnixConnection
    assert cancel_safe_class(CancelSafeConnection) is CancelSafeConnection
    pool = connect("redis://127.0.0.1:1/0", 4).connection_pool
    assert pool.connection_class is CancelSafeConnection
    assert connect_tool("rediss://127.0.0.1:1/0").connection_pool.connection_class is CancelSafeSSLConnection


async def test_a_write_that_cannot_drain_times_out_and_drops_the_connection() -> None:
    class Stuck:  # a fake writer whose peer never reads
        def writelines(self, _parts: object) -> None: ...

        async def drain(self) -> None:
            await asyncio.Event().wait()

        def close(self) -> None: ...

        def is_closing(self) -> bool:
            return False

    conn = CancelSafeConnection(host="127.0.0.1", port=1, socket_timeout=0.05)
    conn._reader, conn._writer = object(), Stuck()  # type: ignore[assignment]
    with pytest.raises(RedisTimeoutError, match="writing"):
        await conn.send_packed_command(b"PING\r\n", check_health=False)
    assert not conn.is_connected
