"""redis-py connections whose writes a task cancellation always reaches.

NOTE(cancel): with a socket timeout (redis-py's default is 5 s), redis-py wraps each write of a command in
``asyncio.wait_for``. On Python 3.11, ``wait_for`` returns the inner result when the outer task is cancelled
at the moment the write completes, and drops the cancellation (CPython gh-86296, fixed in 3.12 by building
``wait_for`` on ``asyncio.timeout``). The write completes one loop turn after it starts, so the window is
wide: of 200 tasks looping on GET, each cancelled at a random point, 157 ran on over a Unix socket
(``python -m bench.load.redis_cancel``) and 73 over TCP (a one-off run). In Chimera that left a dispatcher's
reaper running after ``stop`` cancelled it (a test's teardown hung until its timeout), and it could let a
gRPC handler whose caller went away go on with its dispatch.

These classes write under ``asyncio.timeout`` instead, which tells its own expiry from an outside
cancellation. Every client ``redis_client`` makes uses them (``cancel_safe``); everything else about the
connection is redis-py's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TypeVar, cast

from redis.asyncio import BlockingConnectionPool, ConnectionPool
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


async def _send(conn: AbstractConnection, command: bytes | str | Iterable[bytes], check_health: bool) -> None:
    """``send_packed_command`` with the same contract as redis-py's: connect if needed, check the
    connection's health, write; a failed or timed-out write drops the connection."""
    if not conn.is_connected:
        await conn.connect_check_health(check_health=False)
    if check_health:
        await conn.check_health()  # type: ignore[no-untyped-call]
    if isinstance(command, str):
        command = command.encode()
    parts = [command] if isinstance(command, bytes) else command
    try:
        async with asyncio.timeout(conn.socket_timeout or None):
            writer = conn._writer
            if writer is None:
                raise RedisConnectionError("connection closed before the write")
            writer.writelines(parts)
            await writer.drain()
    except TimeoutError:  # before OSError: TimeoutError is one
        await conn.disconnect(nowait=True)
        raise RedisTimeoutError("Timeout writing to socket") from None
    except OSError as e:
        await conn.disconnect(nowait=True)
        raise RedisConnectionError(f"Error while writing to socket: {e}") from e
    except BaseException:
        # A write cut short (cancelled) leaves part of a command on the wire: the connection is unusable.
        await conn.disconnect(nowait=True)
        raise


class _CancelSafeWrite:
    """Mixed in ahead of a redis-py connection class: its writes go through ``_send``."""

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        await _send(cast(AbstractConnection, self), command, check_health)


class CancelSafeConnection(_CancelSafeWrite, Connection):
    pass


class CancelSafeSSLConnection(_CancelSafeWrite, SSLConnection):
    pass


class CancelSafeUnixConnection(_CancelSafeWrite, UnixDomainSocketConnection):
    pass


_SAFE: dict[type[AbstractConnection], type[AbstractConnection]] = {
    Connection: CancelSafeConnection,
    SSLConnection: CancelSafeSSLConnection,
    UnixDomainSocketConnection: CancelSafeUnixConnection,
}


def cancel_safe_class(cls: type[AbstractConnection]) -> type[AbstractConnection]:
    """The cancel-safe counterpart of a redis-py connection class; any other class (one already
    cancel-safe, or one this module does not know) is returned as it is."""
    return _SAFE.get(cls, cls)


_Pool = TypeVar("_Pool", ConnectionPool, BlockingConnectionPool)


def cancel_safe(pool: _Pool) -> _Pool:
    """``pool``, making its connections from now on with the cancel-safe class of the one its URL chose."""
    pool.connection_class = cancel_safe_class(pool.connection_class)
    return pool
