"""An engine that is an existing OpenAI-compatible server (``vllm serve`` or its api_server module).

NOTE(remote): each request is one streamed chat completion with ``stream_options.include_usage`` so the
final token counts are the server's own. ``priority`` is vLLM's extra request field; the server must run with
``--scheduling-policy priority`` (vLLM rejects a non-zero priority otherwise), or set ``send_priority=False``.
Abort closes the HTTP stream, which vLLM turns into an engine-side abort of that request.

NOTE(remote cost): the server sends one chunk per token per request, so reading them is most of what a
remote worker spends per token. The client is aiohttp (its HTTP parser is C) reading raw bytes and
splitting lines itself: httpx spent about 72 CPU-microseconds per chunk in its pure-Python HTTP/1.1 stack
against aiohttp's 35 (same SSE chunks, bench/results/cpu_profile.md).

NOTE(remote failures): a connection-level error (connect, read, protocol) is usually transient: a restarting
proxy, a dropped keep-alive connection. Before any text of the request has arrived it is retried, bounded,
with exponential backoff; after text has arrived it is not (a second run would not continue the same text)
and the request alone fails, as does one that still cannot be served after the retries. Whether the server
itself is gone is the heartbeat's question: ``health()`` probes ``/health`` and says dead only after it has
failed for ``dead_after_s`` on end, and the worker then exits and hands its claims back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from services.common.chat import ToolCall, ToolCallPiece
from services.common.types import EngineProfile, StageRequest
from services.worker.engine.base import (
    EngineDeadError,
    EngineOutput,
    EngineRequestError,
    EngineUnavailableError,
)
from services.worker.engine.openai_form import openai_fields, openai_messages, sampling_fields

log = logging.getLogger(__name__)

# Connection-level failures: transient, or the server is gone; neither says this request was bad.
_TRANSIENT = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)
# What a request to the server may raise (a timeout is not an aiohttp error on every path).
_HTTP_ERRORS = (aiohttp.ClientError, TimeoutError)


def _transient(e: BaseException) -> bool:
    # A stream silent for read_timeout_s is not a dropped connection: it fails the request, unretried.
    return isinstance(e, _TRANSIENT) and not isinstance(e, aiohttp.SocketTimeoutError)


class RemoteRequestError(RuntimeError):
    """The server failed one request (HTTP 5xx); the engine itself is still up."""


class RemoteUnavailableError(RemoteRequestError, EngineUnavailableError):
    """The server could not serve one request: unreachable through every retry, or its stream broke after
    text had arrived. The request fails; the health probe decides whether the engine is dead."""


class RemoteRejectedError(EngineRequestError):
    """The server refused one request as invalid (HTTP 4xx, e.g. longer than its context)."""


@dataclass(frozen=True, slots=True)
class RemoteEngineConfig:
    base_url: str  # e.g. http://10.0.0.5:8000 (no /v1)
    model: str = ""  # the served model name; empty: the first model the server lists
    max_num_seqs: int = 16  # the server's --max-num-seqs: what the worker admits at most
    api_key: str = ""
    send_priority: bool = True
    # Ask the server for text every this many tokens (vLLM's stream_interval; the first token at once):
    # one SSE chunk to parse per N tokens. Sent only above 1, so other OpenAI servers see a plain body.
    stream_tokens: int = 1
    connect_timeout_s: float = 5.0
    # Longest silence between two streamed chunks before the request is treated as failed.
    read_timeout_s: float = 120.0
    start_timeout_s: float = 60.0
    # A request's connection-level failures before its first text: tries in all, and the first backoff
    # (doubling, at most retry_max_backoff_s).
    retry_attempts: int = 4
    retry_backoff_s: float = 0.25
    retry_max_backoff_s: float = 4.0
    # health(): the engine is dead once /health has failed for this long on end (one failure is a blip).
    dead_after_s: float = 15.0
    health_timeout_s: float = 2.0


@dataclass
class _Stream:
    queue: asyncio.Queue[EngineOutput | BaseException] = field(default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None
    cancelled: bool = False
    deltas: int = 0


def chat_body(
    request: StageRequest, model: str, priority: int, send_priority: bool, stream_tokens: int = 1
) -> dict[str, Any]:
    """The JSON body of one chat completion for ``request``: streamed, unless its caller reads only the
    final event (``StageRequest.stream``), which asks the server for the whole answer in one body."""
    fields = {k: v for k, v in sampling_fields(request.sampling).items() if v is not None}
    body: dict[str, Any] = {
        "model": model,
        "messages": openai_messages(request.messages),
        # Unset: the server generates up to its context's end.
        **({} if request.sampling.to_context else {"max_tokens": request.sampling.max_tokens}),
        **fields,
        **openai_fields(request),
        "stream": request.stream,
    }
    if request.stream:
        body["stream_options"] = {"include_usage": True}
        if stream_tokens > 1:
            body["stream_interval"] = stream_tokens
    if send_priority:
        body["priority"] = priority
    return body


class _CallsRead:
    """The tool-call deltas of a vLLM server's stream: our pieces out, the whole calls at the end."""

    def __init__(self) -> None:
        self._calls: dict[int, list[str]] = {}  # index -> [id, name, arguments so far]

    def read(self, deltas: Any) -> tuple[ToolCallPiece, ...]:
        out = []
        for d in deltas:
            index, fn = int(d.get("index", 0)), d.get("function") or {}
            call = self._calls.setdefault(index, ["", "", ""])
            piece = ToolCallPiece(index, d.get("id") or "", fn.get("name") or "", fn.get("arguments") or "")
            call[0], call[1] = call[0] or piece.id, call[1] or piece.name
            call[2] += piece.arguments
            out.append(piece)
        return tuple(out)

    def whole(self) -> tuple[ToolCall, ...]:
        return tuple(ToolCall(*self._calls[i]) for i in sorted(self._calls))


def cached_tokens(usage: Mapping[str, Any]) -> int:
    """A server's prefix-cache hits (``usage.prompt_tokens_details.cached_tokens``: vllm serve with
    ``--enable-prompt-tokens-details``); 0 where it does not say."""
    details = usage.get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0) if isinstance(details, Mapping) else 0


def _whole_output(body: Mapping[str, Any]) -> EngineOutput:
    """A non-streamed chat completion as one final output: its text, its calls whole, its usage."""
    choice = (body.get("choices") or [{}])[0]
    msg, usage = choice.get("message") or {}, body.get("usage") or {}
    calls = tuple(
        ToolCall(c.get("id") or "", (c.get("function") or {}).get("name") or "",
                 (c.get("function") or {}).get("arguments") or "")
        for c in msg.get("tool_calls") or ()
    )  # fmt: skip
    return EngineOutput(
        msg.get("content") or "",
        finished=True,
        finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        completion_tokens=int(usage.get("completion_tokens", 0)),
        cached_tokens=cached_tokens(usage),
        tool_calls=calls,
    )


class RemoteEngine:
    """The Engine protocol over an OpenAI-compatible HTTP server."""

    def __init__(self, cfg: RemoteEngineConfig) -> None:
        self.cfg = cfg
        self.model = cfg.model
        self.max_num_seqs = cfg.max_num_seqs
        # Its vLLM server parses the calls (its --tool-call-parser); one started without answers a 400.
        self.calls_tools = True
        self._base = cfg.base_url.rstrip("/")
        self._client: aiohttp.ClientSession | None = None
        self._streams: dict[str, _Stream] = {}
        self._failing_since: float | None = None  # monotonic time of the first of consecutive failed probes

    async def start(self) -> None:
        """Connect and wait (bounded) for the server's /health, then learn the model name if not given."""
        headers = {"Authorization": f"Bearer {self.cfg.api_key}"} if self.cfg.api_key else {}
        self._client = aiohttp.ClientSession(
            headers=headers,
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self.cfg.connect_timeout_s, sock_read=self.cfg.read_timeout_s
            ),
            connector=aiohttp.TCPConnector(limit=self.max_num_seqs + 8),
        )
        deadline = time.monotonic() + self.cfg.start_timeout_s
        while True:
            try:
                async with self._client.get(f"{self._base}/health") as resp:
                    if resp.status == 200:
                        break
            except _HTTP_ERRORS:
                pass
            if time.monotonic() > deadline:
                raise EngineDeadError(f"no healthy server at {self.cfg.base_url}")
            await asyncio.sleep(0.5)
        if not self.model:
            async with self._client.get(f"{self._base}/v1/models") as resp:
                models = (await resp.json())["data"]
            self.model = str(models[0]["id"])
        log.info("remote engine %s at %s ready", self.model, self.cfg.base_url)

    async def stop(self) -> None:
        for key in list(self._streams):
            await self.abort(key)
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def _read(self, key: str, body: dict[str, Any], st: _Stream) -> None:
        """Stream one completion into ``st.queue``; ends with a final output or an exception. A
        connection-level failure before the first text is retried (see the module's note)."""
        cfg = self.cfg

        def retryable(e: BaseException) -> bool:
            return _transient(e) and st.deltas == 0

        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(retryable),
                stop=stop_after_attempt(max(1, cfg.retry_attempts)),
                wait=wait_exponential(multiplier=cfg.retry_backoff_s, max=cfg.retry_max_backoff_s),
                before_sleep=lambda rs: log.warning(
                    "remote request %s: %r; retrying (try %d)",
                    key,
                    rs.outcome.exception() if rs.outcome else None,
                    rs.attempt_number + 1,
                ),
                reraise=True,
            ):
                with attempt:
                    await self._request_once(key, body, st)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # handed to the consumer, which re-raises it in its own task
            if _transient(e):
                where = "after its text began" if st.deltas else f"after {cfg.retry_attempts} tries"
                e = RemoteUnavailableError(f"remote engine {cfg.base_url} failed {key} {where}: {e!r}")
            st.queue.put_nowait(e)

    async def _request_once(self, key: str, body: dict[str, Any], st: _Stream) -> None:
        assert self._client is not None
        # A whole answer comes after the whole generation: no read timeout between chunks (the worker's
        # max_run_s still bounds it); a stream is failed after read_timeout_s of silence.
        whole = aiohttp.ClientTimeout(total=None, sock_connect=self.cfg.connect_timeout_s, sock_read=None)
        kw: dict[str, Any] = {} if body["stream"] else {"timeout": whole}
        async with self._client.post(f"{self._base}/v1/chat/completions", json=body, **kw) as resp:
            if resp.status != 200:
                detail = (await resp.read()).decode(errors="replace")[:500]
                msg = f"HTTP {resp.status} for {key}: {detail}"
                if 400 <= resp.status < 500:
                    raise RemoteRejectedError(msg)
                raise RemoteRequestError(msg)
            if body["stream"]:
                await self._read_events(resp, st)
            else:
                st.queue.put_nowait(_whole_output(await resp.json()))

    async def _read_events(self, resp: aiohttp.ClientResponse, st: _Stream) -> None:
        """A streamed completion's server-sent events into ``st.queue``, its final output last."""
        text_reason: str | None = None
        usage: dict[str, Any] = {}
        calls = _CallsRead()
        rest, done = b"", False
        async for data in resp.content.iter_any():
            # Server-sent events, one "data: <json>" line each; a read may end inside a line.
            *lines, rest = (rest + data).split(b"\n")
            for line in lines:
                if not line.startswith(b"data: "):
                    continue
                payload = line[6:].strip()
                if done := payload == b"[DONE]":
                    break
                chunk = json.loads(payload)
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    text = delta.get("content") or ""
                    pieces = calls.read(delta.get("tool_calls") or ())
                    if text or pieces:
                        st.deltas += 1
                        st.queue.put_nowait(EngineOutput(text, tool_pieces=pieces))
                    text_reason = choice.get("finish_reason") or text_reason
            if done:
                break
        st.queue.put_nowait(
            EngineOutput(
                "",
                finished=True,
                finish_reason="length" if text_reason == "length" else "stop",
                prompt_tokens=int(usage.get("prompt_tokens", 0)),
                completion_tokens=int(usage.get("completion_tokens", 0)),
                cached_tokens=cached_tokens(usage),
                tool_calls=calls.whole(),
            )
        )

    async def health(self) -> str | None:
        """Dead once ``/health`` has failed (no answer, or not 200) for ``dead_after_s`` on end."""
        if self._client is None:
            return "remote engine is not started"
        try:
            timeout = aiohttp.ClientTimeout(total=self.cfg.health_timeout_s)
            async with self._client.get(f"{self._base}/health", timeout=timeout) as resp:
                ok, why = resp.status == 200, f"HTTP {resp.status}"
        except _HTTP_ERRORS as e:
            ok, why = False, repr(e)
        now = time.monotonic()
        if ok:
            self._failing_since = None
            return None
        if self._failing_since is None:
            self._failing_since = now
            log.warning("remote engine %s: /health failed (%s)", self.cfg.base_url, why)
        down_s = now - self._failing_since
        if down_s >= self.cfg.dead_after_s:
            return f"remote engine {self.cfg.base_url}: /health failing for {down_s:.0f} s ({why})"
        return None

    async def generate(self, request: StageRequest, key: str, priority: int) -> AsyncIterator[EngineOutput]:
        if self._client is None:
            raise RuntimeError("RemoteEngine.start() was not called")
        st = _Stream()
        self._streams[key] = st
        body = chat_body(request, self.model, priority, self.cfg.send_priority, self.cfg.stream_tokens)
        st.task = asyncio.create_task(self._read(key, body, st), name=f"remote-{key}")
        try:
            while True:
                item = await st.queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item.finished:
                    # Free the slot before the final yield: a consumer may stop iterating right after it.
                    self._streams.pop(key, None)
                    yield item
                    return
                yield item
        finally:
            self._streams.pop(key, None)
            if not st.task.done():
                st.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await st.task

    async def abort(self, key: str) -> None:
        """Close ``key``'s stream (the server aborts it); generate() then yields a final "cancelled"."""
        st = self._streams.get(key)
        if st is None or st.cancelled or st.task is None or st.task.done():
            return  # unknown, already aborted, or already answered: its one final is on its way
        st.cancelled = True
        st.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await st.task
        # The server's counts died with the stream: completion_tokens is the deltas seen, a lower bound.
        st.queue.put_nowait(
            EngineOutput("", finished=True, finish_reason="cancelled", completion_tokens=st.deltas)
        )

    def running(self) -> int:
        return len(self._streams)

    def profile(self) -> EngineProfile | None:
        return None
