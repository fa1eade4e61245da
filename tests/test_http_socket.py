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


async def test_idle_connection_outlives_client_pool_expiry() -> None:
    """A kept-alive connection idle for longer than httpx's 5 s pool expiry still serves: the door must
    not close one a client may be reusing at that moment (see NOTE(keepalive) in the dispatcher's config)."""
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse

    from services.dispatcher.config import DispatcherSettings
    from services.dispatcher.http_api import HttpServer

    app = FastAPI()

    @app.get("/ping")
    async def ping() -> PlainTextResponse:
        return PlainTextResponse("pong")

    keepalive = DispatcherSettings().http_keepalive_s
    assert keepalive > 5
    server = HttpServer(app, "127.0.0.1", 0, grace_s=1.0, keepalive_s=keepalive)
    port = await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"
        for _ in range(2):
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200")
            assert await asyncio.wait_for(reader.readexactly(4), 5) == b"pong"
            await asyncio.sleep(5.5)  # past uvicorn's own default, which closed the connection here
        writer.close()
    finally:
        await server.stop()
