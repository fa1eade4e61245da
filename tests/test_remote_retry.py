"""RemoteEngine's transient failures against a real socket server that drops connections: retried before
the first text, bounded; a request that still cannot be served fails alone; health() says dead only after
/health has failed for dead_after_s on end."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from services.common.types import ChatMessage, SamplingParams, StageRequest
from services.worker.engine.base import EngineUnavailableError
from services.worker.engine.remote import RemoteEngine, RemoteEngineConfig

pytestmark = pytest.mark.unit


def _sse(text: str) -> bytes:
    chunks: list[dict[str, Any]] = [
        {"choices": [{"delta": {"content": w}, "finish_reason": None}]} for w in text.split(" ")
    ]
    chunks.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": len(chunks)}})
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return body.encode()


class FlakyServer:
    """Answers /health with 200 and each chat completion with a stream, after dropping the first ``drops``
    completion connections without a response (what a restarting proxy does)."""

    def __init__(self, drops: int) -> None:
        self.drops = drops
        self.completions = 0
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        length = next(
            (int(h.split(":")[1]) for h in head.split("\r\n") if h.lower().startswith("content-length")), 0
        )
        if length:
            await reader.readexactly(length)
        if head.startswith("GET /health"):
            body = b""
        else:
            self.completions += 1
            if self.completions <= self.drops:
                writer.close()
                return
            body = _sse("hello from the server")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
        writer.write(f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body)
        await writer.drain()
        writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


def _req() -> StageRequest:
    return StageRequest(
        request_id="r",
        program_id="p",
        stage=0,
        workflow="test",
        messages=(ChatMessage("user", "Say hello."),),
        sampling=SamplingParams(max_tokens=8),
    )


async def _text(engine: RemoteEngine) -> str:
    out = ""
    async for o in engine.generate(_req(), "r:1", 0):
        out += o.text_delta
    return out


def _cfg(url: str, **kw: Any) -> RemoteEngineConfig:
    return RemoteEngineConfig(base_url=url, model="m", retry_backoff_s=0.01, start_timeout_s=5, **kw)


async def test_dropped_connections_before_any_text_are_retried() -> None:
    flaky = FlakyServer(drops=2)
    async with flaky as url:
        engine = RemoteEngine(_cfg(url))
        await engine.start()
        try:
            assert await _text(engine) == "hellofromtheserver"  # one delta per word, spaces dropped by _sse
            assert flaky.completions == 3
            assert await engine.health() is None
        finally:
            await engine.stop()


async def test_a_request_that_cannot_be_served_after_retries_fails_alone() -> None:
    flaky = FlakyServer(drops=100)
    async with flaky as url:
        engine = RemoteEngine(_cfg(url, retry_attempts=3))
        await engine.start()
        try:
            with pytest.raises(EngineUnavailableError):
                await _text(engine)
            assert flaky.completions == 3  # bounded
            assert await engine.health() is None  # the server answers /health: the engine lives
        finally:
            await engine.stop()


async def test_health_says_dead_only_after_failing_for_dead_after_s() -> None:
    flaky = FlakyServer(drops=0)
    async with flaky as url:
        engine = RemoteEngine(_cfg(url, dead_after_s=0.3, health_timeout_s=0.5))
        await engine.start()
    try:  # the server is gone now
        assert await engine.health() is None  # one failure is a blip
        await asyncio.sleep(0.4)
        reason = await engine.health()
        assert reason is not None and "/health failing" in reason
    finally:
        await engine.stop()
