"""OpenAI-compatible HTTP front door, served by uvicorn in the dispatcher's own asyncio loop.

It shares the one ``Dispatcher`` with the gRPC server, so both doors see the same queues and programs.

The workflow identity (headers or ``metadata``) and the body-size guard are ``http_input``'s.

NOTE(retries): when a worker dies mid-stream, the request is re-run and its deltas restart at a higher
attempt. SSE cannot take text back, so the stream keeps forwarding only the first attempt's deltas and, at
the end, sends whatever the final answer adds beyond the text already sent; if the re-run diverged from
what was sent, the stream ends with an error event instead of a silently spliced answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Generator, Mapping
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.common import tls
from services.common.types import ChatMessage
from services.dispatcher.dispatch import Dispatcher
from services.dispatcher.door import DoorGate, backstop
from services.dispatcher.errors import DispatchError, Overloaded
from services.dispatcher.handoff import Delta, Dispatched, Final
from services.dispatcher.http_doc import document
from services.dispatcher.http_identity import RequestPrograms
from services.dispatcher.http_input import (
    BodyLimit,
    BodyTooLarge,
    DoorGuard,
    Identity,
    chat_messages,
    check_metadata,
    error_response,
    overloaded_response,
    prompt_messages,
)
from services.dispatcher.http_programs import ProgramEndpoints
from services.dispatcher.http_responses import ResponsesEndpoint
from services.dispatcher.intake import AUTO_MODEL, Intake
from services.dispatcher.openai_schema import (
    ChatCompletionRequest,
    CompletionRequest,
    Kind,
    chunk_body,
    completion_body,
    domain_error,
    error_body,
)
from services.dispatcher.sse_calls import CallsSent
from services.dispatcher.tenancy import client_id

log = logging.getLogger(__name__)

_DISCONNECT_POLL_S = 0.5


class OpenAIFrontDoor:
    """Request handlers; ``app()`` wires them into a FastAPI application."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._d = dispatcher
        self.gate = DoorGate(dispatcher.settings.door_limit())
        self.programs = RequestPrograms(dispatcher)

    def app(self) -> FastAPI:
        app = FastAPI(title="Chimera (OpenAI-compatible)", docs_url=None, redoc_url=None)
        app.add_api_route("/v1/chat/completions", self.chat, methods=["POST"], response_model=None)
        app.add_api_route("/v1/completions", self.completions, methods=["POST"], response_model=None)
        app.add_api_route(
            "/v1/responses", ResponsesEndpoint(self).create, methods=["POST"], response_model=None
        )
        app.add_api_route("/v1/models", self.models, methods=["GET"])
        app.add_api_route("/v1/programs/{program_id}/end", ProgramEndpoints(self._d).end, methods=["POST"])
        app.add_api_route("/health", self.health, methods=["GET"])
        app.add_exception_handler(DispatchError, _dispatch_error)
        app.add_exception_handler(RequestValidationError, _validation_error)
        app.add_exception_handler(StarletteHTTPException, _http_error)
        app.add_exception_handler(Exception, _unexpected_error)
        app.add_middleware(BodyLimit, limit=self._d.settings.max_body_bytes)
        # Added last, so outermost: a full door refuses before the body is read. The probe never waits.
        app.add_middleware(DoorGuard, gate=self.gate, exempt=frozenset({"/health"}))
        document(app, self._d.settings)  # /openapi.json: headers, limits and error statuses as served
        return app

    @property
    def dispatcher(self) -> Dispatcher:
        return self._d

    async def health(self) -> dict[str, str]:
        return {"status": "ok"}

    async def _tenant(self, request: Request) -> str:
        return (await self._d.auth.principal(request.headers.get("authorization"))).tenant

    async def models(self, request: Request) -> dict[str, Any]:
        engines = await self._d.quotas.visible(await self._tenant(request), await self._d.engines())
        names = [AUTO_MODEL, *sorted({e.model for e in engines if e.model})]
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "chimera"} for n in names]
        return {"object": "list", "data": data}

    async def chat(self, body: ChatCompletionRequest, request: Request) -> Response:
        return await self._serve("chat", body, chat_messages(body), request)

    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        return await self._serve("text", body, prompt_messages(body), request)

    async def _serve(
        self,
        kind: Kind,
        body: ChatCompletionRequest | CompletionRequest,
        messages: tuple[ChatMessage, ...],
        request: Request,
    ) -> Response:
        tenant = await self._tenant(request)
        check_metadata(body.metadata, self._d.settings.max_metadata_chars)
        ident = await self.programs.identify(
            tenant, request.headers, body.metadata, body.prompt_cache_key, body.model, messages
        )
        tool_use = body.tool_use() if isinstance(body, ChatCompletionRequest) else None
        intake = Intake(
            program_id=ident.program_id,
            stage=ident.stage,
            workflow=ident.workflow,
            messages=messages,
            sampling=body.sampling(),
            model=body.model,
            request_id=ident.request_id,
            timeout_ms=ident.timeout_ms,
            last_stage=ident.last_stage(tool_use),
            tool_use=tool_use,
            response_format=body.format() if isinstance(body, ChatCompletionRequest) else None,
            stream=body.stream,
            identity=ident.source,
        )
        dispatched, headers = await self.submit(intake, ident, tenant)
        stage = dispatched.request.stage
        if body.stream:
            events = self._sse(kind, dispatched, ident, tenant, body.include_usage())
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)
        final = await self.final_of(dispatched, ident, tenant, request)
        if final is None:
            return Response(status_code=499)  # the caller is gone; nobody reads this
        return JSONResponse(completion_body(kind, final, ident.program_id, stage), headers=headers)

    async def submit(self, intake: Intake, ident: Identity, tenant: str) -> tuple[Dispatched, dict[str, str]]:
        """Dispatch ``intake``; the request and the X-Chimera-* response headers that say where it went."""
        try:
            dispatched = await self._d.submit(intake, tenant)
        except BaseException:
            await self.programs.refused(ident, tenant)
            raise
        headers = {
            "X-Chimera-Program-Id": ident.program_id,
            "X-Chimera-Identity": ident.source,
            "X-Chimera-Stage": str(dispatched.request.stage),
            "X-Chimera-Request-Id": client_id(dispatched.request.request_id),
            "X-Chimera-Engine": dispatched.engine,
            "X-Chimera-Model": dispatched.model,
        }
        if dispatched.browned_out_from:
            headers["X-Chimera-Brownout-From"] = dispatched.browned_out_from
        return dispatched, headers

    async def final_of(self, d: Dispatched, ident: Identity, tenant: str, request: Request) -> Final | None:
        """The request's Final (its program remembered or forgotten after it); None if the caller left."""
        final: Final | None = None
        try:
            final = await self._final(d, request)
            return final
        finally:
            await self.programs.finished(ident, tenant, d, final)

    async def _final(self, d: Dispatched, request: Request) -> Final | None:
        """The request's Final; None (and the request cancelled) if the HTTP caller disconnects first."""

        async def last() -> Final:
            async for item in self._d.stream(d):
                if isinstance(item, Final):
                    return item
            raise AssertionError("stream_output ends with a Final or raises")

        task = asyncio.create_task(last())
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
                if done:
                    return task.result()
                if await request.is_disconnected():
                    log.info("HTTP caller of %s went away", d.request.request_id)
                    return None
        finally:
            if not task.done():
                task.cancel()  # stream_output cancels the request on its way out
                with contextlib.suppress(asyncio.CancelledError, DispatchError):
                    await task

    async def _sse(
        self, kind: Kind, d: Dispatched, ident: Identity, tenant: str, include_usage: bool
    ) -> AsyncIterator[str]:
        rid, model, created = client_id(d.request.request_id), d.model, int(time.time())
        sent, first_attempt, calls = "", 0, CallsSent()
        told = False  # the program was told how the stream ended
        try:
            if kind == "chat":
                yield _sse(chunk_body(kind, rid, model, created, text="", role=True))
            async for item in self._d.stream(d):
                if isinstance(item, Delta):
                    first_attempt = first_attempt or item.attempt
                    if item.attempt != first_attempt:
                        continue
                    if item.text:
                        sent += item.text
                        yield _sse(chunk_body(kind, rid, model, created, text=item.text))
                    if item.tool_calls:
                        calls.note(item.tool_calls)
                        yield _sse(chunk_body(kind, rid, model, created, tool_calls=item.tool_calls))
                    continue
                rest_calls = calls.rest(item.tool_calls)
                if not item.text.startswith(sent) or rest_calls is None:
                    log.warning("request %s was re-run and diverged from its streamed text", rid)
                    yield _sse(
                        error_body(
                            "the request was re-run after a worker failure and its answer changed; retry",
                            "server_error",
                            "stream_restarted",
                        )
                    )
                    return
                # Remembered before the caller sees the end: an agent sends its next turn the moment it
                # does, and that turn must find this one's conversation.
                told = True
                await self.programs.finished(ident, tenant, d, item)
                if rest_calls:
                    yield _sse(chunk_body(kind, rid, model, created, tool_calls=rest_calls))
                rest = item.text[len(sent) :]
                yield _sse(chunk_body(kind, rid, model, created, text=rest, finish_reason=item.finish_reason))
                if include_usage:
                    yield _sse(
                        chunk_body(
                            kind,
                            rid,
                            model,
                            created,
                            usage_of=item,
                            program_id=ident.program_id,
                            stage=d.request.stage,
                        )
                    )
            yield "data: [DONE]\n\n"
        except DispatchError as e:
            yield _sse(domain_error(e.code, str(e))[1])
        finally:
            if not told:
                await self.programs.finished(ident, tenant, d, None)


def _sse(body: Mapping[str, Any]) -> str:
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"


async def _dispatch_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, DispatchError)
    if isinstance(exc, Overloaded):
        return overloaded_response(exc)
    return error_response(*domain_error(exc.code, str(exc)))


async def _validation_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    message = f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid request')}"
    return error_response(
        400, error_body(message, "invalid_request_error", "invalid_argument", ".".join(loc))
    )


async def _http_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if isinstance(exc, BodyTooLarge):  # a size limit, shaped as the domain's other size limits are
        return error_response(*domain_error("RESOURCE_EXHAUSTED", str(exc.detail)))
    return error_response(exc.status_code, error_body(str(exc.detail), "invalid_request_error", None))


async def _unexpected_error(_: Request, exc: Exception) -> Response:
    log.error("HTTP call failed", exc_info=exc)
    return error_response(500, error_body("dispatcher error; see its log", "server_error", "internal"))


def bind_tcp(host: str, port: int) -> socket.socket:
    """A listening socket for uvicorn, bound now so that port 0 reports the port it got."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and one made
    # with the default protocol (0) left every response to Nagle, 40 ms behind the client's delayed ACK on
    # a kept-alive connection (measured: 52 ms per one-stage request instead of 10).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


class _EmbeddedUvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # The process's run() owns SIGTERM/SIGINT and stops both front doors together.
        yield


class HttpServer:
    """uvicorn serving ``app`` on a socket bound up front (so port 0 reports the port it got)."""

    def __init__(
        self,
        app: FastAPI,
        host: str,
        port: int,
        grace_s: float,
        limit: int | None = None,
        transport: tls.ServerTls | None = None,
        keepalive_s: int = 120,
    ) -> None:
        self._app, self._host, self._port, self._grace_s = app, host, port, grace_s
        self._limit = limit
        self._keepalive_s = keepalive_s
        self._tls = transport
        self._server: _EmbeddedUvicorn | None = None
        self._task: asyncio.Task[None] | None = None
        self.port = 0

    async def start(self, timeout_s: float = 10.0) -> int:
        sock = bind_tcp(self._host, self._port)
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            self._app,
            log_config=None,
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=max(1, int(self._grace_s)),
            # uvicorn answers 503 past this, and counts connections (idle keep-alive ones too), not just
            # requests: only a backstop, well above the door's gate, which refuses first with a 429.
            limit_concurrency=self._limit,
            backlog=4096,
            timeout_keep_alive=self._keepalive_s,  # see NOTE(keepalive) in config.py
            **tls.uvicorn_ssl(self._tls),
        )
        self._server = _EmbeddedUvicorn(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="http")
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if self._task.done() or time.monotonic() > deadline:
                sock.close()
                if self._task.done():
                    self._task.result()  # re-raises why it stopped
                raise RuntimeError(f"HTTP server did not start on {self._host}:{self.port}")
            await asyncio.sleep(0.01)
        scheme = "http" if self._tls is None else "https"
        log.info("OpenAI-compatible HTTP on %s://%s:%d/v1", scheme, self._host, self.port)
        return self.port

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        await self._task


def build_http_server(dispatcher: Dispatcher) -> HttpServer:
    s = dispatcher.settings
    app = OpenAIFrontDoor(dispatcher).app()
    transport = tls.server_tls(s.tls_cert_file, s.tls_key_file)
    hard_stop = backstop(s.door_limit())
    return HttpServer(
        app, s.http_host or s.host, s.http_port, s.grace_s, hard_stop, transport, s.http_keepalive_s
    )
