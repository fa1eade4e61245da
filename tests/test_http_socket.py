"""The HTTP door's listening socket: connections asyncio accepts on it send without Nagle's delay (a
socket made without its protocol number got no TCP_NODELAY, and every kept-alive request waited 40 ms)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from services.dispatcher.http_api import bind_tcp

pytestmark = pytest.mark.timeout(30)


async def test_accepted_connections_have_nodelay() -> None:
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[int] = loop.create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    listener = bind_tcp("127.0.0.1", 0)
    server = await loop.create_server(Probe, sock=listener)
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", listener.getsockname()[1])
        assert await asyncio.wait_for(accepted, 10) != 0
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
