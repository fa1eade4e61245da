"""What the HTTP door takes in, before the shared intake: the door's gate, the body-size guard, headers
and ``metadata`` as a workflow identity, OpenAI messages as Chimera's. Pure apart from the ASGI guards.

NOTE(identity): a request's program is found, in this order: Chimera's headers (``X-Chimera-Program-Id``,
``X-Chimera-Stage``, ``X-Chimera-Workflow``) or the same names in its ``metadata`` (``program_id``,
``stage``, ``workflow``), headers first; a session id an agent client already sends (``SESSION_HEADERS``,
then the body's ``prompt_cache_key``); the conversation it continues (``services.dispatcher.conversation``,
looked up by the door); else a new program. A request with a program id but no stage is the program's next
stage (its last stage + 1, or 0 for a new program), which lets a framework that can only set one header
still run a multi-stage workflow. A program no client named (a session, a continuation or a new one) is
never ended by the client: its row lives ``conversation_ttl_s`` past its last stage.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.common.chat import ToolCall, ToolUse
from services.common.types import ChatMessage
from services.dispatcher.door import DoorGate
from services.dispatcher.errors import InvalidRequest, Overloaded, RequestTooLarge
from services.dispatcher.intake import IdentitySource
from services.dispatcher.openai_schema import (
    ChatCompletionRequest,
    CompletionRequest,
    domain_error,
    error_body,
)
from services.dispatcher.validate import MAX_TIMEOUT_MS, check_text

H_PROGRAM, H_STAGE, H_WORKFLOW = "x-chimera-program-id", "x-chimera-stage", "x-chimera-workflow"
H_REQUEST, H_TIMEOUT = "x-chimera-request-id", "x-chimera-timeout-ms"
DEFAULT_WORKFLOW = "default"
# Session ids that agent clients send on every call of one session, first match wins: a generic one several
# routers read (vLLM's production-stack router, SGLang's), Claude Code's (through an OpenAI-compatible
# gateway such as LiteLLM), OpenCode's, Codex's (hyphenated in current builds, underscored in older ones)
# and LiteLLM's (OpenHands sends it). The OpenAI Agents SDK and LangGraph send none to a server that is
# not OpenAI's: their loops are found by continuation.
SESSION_HEADERS = (
    "x-session-id",
    "x-claude-code-session-id",
    "x-session-affinity",
    "session-id",
    "session_id",
    "x-litellm-session-id",
)
# Long enough for any uint64; a longer run of digits is refused before int() turns it into a bignum.
_DIGITS = re.compile(r"[0-9]{1,20}")


def error_response(status: int, body: dict[str, Any], retry_after: str | None = None) -> JSONResponse:
    # Client errors will fail the same way again; tell OpenAI clients not to retry them.
    retry = "true" if status in (429, 503, 504) else "false"
    headers = {"x-should-retry": retry}
    if retry_after is not None:
        headers["retry-after"] = retry_after
    if status == 401:
        headers["www-authenticate"] = 'Bearer realm="chimera"'
    return JSONResponse(body, status_code=status, headers=headers)


def overloaded_response(e: Overloaded) -> JSONResponse:
    # Busy is not down: 429 with when to come back, in OpenAI's rate-limit shape (never 503).
    return error_response(429, error_body(str(e), "rate_limit_error", "rate_limit_exceeded"), e.retry_after)


class DoorGuard:
    """ASGI guard: every HTTP request but the ``exempt`` paths (probes) holds a place at ``gate`` until its
    response is sent, a streamed one to its last event or until the client goes away. A full gate answers
    429 with a Retry-After before anything is read, so that uvicorn's own limit (a 503) stays a backstop."""

    def __init__(self, app: ASGIApp, gate: DoorGate, exempt: frozenset[str] = frozenset()) -> None:
        self.app, self.gate, self.exempt = app, gate, exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        with contextlib.ExitStack() as place:
            try:
                place.enter_context(self.gate.held())
            except Overloaded as e:  # only the gate's refusal: the app's own errors are its handlers'
                await overloaded_response(e)(scope, receive, send)
                return
            await self.app(scope, receive, send)


class BodyTooLarge(HTTPException):
    """Raised from inside the body read, which FastAPI lets through as an HTTP error (413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body is over the limit of {limit} bytes")


class BodyLimit:
    """ASGI guard: a body over ``limit`` bytes is refused with 413 before it is parsed. A declared
    Content-Length over it is refused before a byte is read; a chunked body is counted as it arrives."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared and (not declared.isdigit() or int(declared) > self.limit):
            status, body = domain_error("RESOURCE_EXHAUSTED", BodyTooLarge(self.limit).detail)
            await error_response(status, body)(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, counted, send)


def check_metadata(metadata: Mapping[str, str] | None, max_chars: int) -> None:
    if not metadata:
        return
    size = sum(len(k) + len(v) for k, v in metadata.items())
    if size > max_chars:
        raise RequestTooLarge(f"metadata has {size} characters; the limit is {max_chars}")
    for k, v in metadata.items():
        check_text("metadata", k)
        check_text(f"metadata[{k!r}]", v)


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a request belongs to. ``stage`` None means "the program's next stage"."""

    program_id: str
    stage: int | None
    workflow: str
    source: str  # how the program was found: an ``IdentitySource``
    request_id: str  # "": the dispatcher makes one
    timeout_ms: int

    @property
    def unnamed(self) -> bool:
        """No client named this program, so none will end it: its answers are remembered for their
        continuation and its row lapses after ``conversation_ttl_s``."""
        return self.source in IdentitySource.UNNAMED

    @property
    def new(self) -> bool:
        """A program made for this request alone so far: a refused or unanswered request forgets it."""
        return self.source == IdentitySource.NEW

    def last_stage(self, tool_use: ToolUse | None) -> bool:
        """Whether this stage is taken to end its program: one no client named and offered no tool is a
        chat turn, all of its program that is known; a loop with tools to call goes on."""
        return self.source in (IdentitySource.NEW, IdentitySource.CONTINUATION) and tool_use is None

    def continuing(self, program_id: str) -> Identity:
        """This request as the next stage of ``program_id``, whose conversation it continues."""
        return replace(self, program_id=program_id, stage=None, source=IdentitySource.CONTINUATION)


def _int(name: str, raw: str | None, default: int | None, maximum: int | None = None) -> int | None:
    if raw is None or raw.strip() == "":
        return default
    # Only ASCII digits: int() would also take "1_000", "+5" and other scripts' digits.
    if not _DIGITS.fullmatch(raw.strip()):
        raise InvalidRequest(f"{name} must be a non-negative integer of at most 20 digits, got {raw[:40]!r}")
    value = int(raw)
    if maximum is not None and value > maximum:
        raise InvalidRequest(f"{name} must be in [0, {maximum}], got {value}")
    return value


def session_program(value: str) -> str:
    """The program id of a client's session id: a digest, so that any header value is a valid key name."""
    return "session-" + hashlib.sha256(value.encode()).hexdigest()[:32]


def resolve_identity(
    headers: Mapping[str, str], metadata: Mapping[str, str] | None, prompt_cache_key: str | None = None
) -> Identity:
    """Workflow identity from headers, else metadata, else a session id, else a new program (pure); the
    door may then find the conversation a new one continues (``Identity.continuing``)."""
    meta = metadata or {}

    def pick(header: str, key: str) -> str | None:
        value = headers.get(header)
        return value if value is not None else meta.get(key)

    program = (pick(H_PROGRAM, "program_id") or "").strip()
    source = IdentitySource.HEADER if headers.get(H_PROGRAM, "").strip() else IdentitySource.METADATA
    if not program:
        session = next((v.strip() for h in SESSION_HEADERS if (v := headers.get(h, "")).strip()), "")
        session = session or (prompt_cache_key or "").strip()
        program = session_program(session) if session else ""
        source = IdentitySource.SESSION
    if not program:
        program, source = f"http-{uuid.uuid4().hex}", IdentitySource.NEW
    # A named program's stage is the client's to give; a session's is its next; a new program's is its first.
    stage = _int("stage", pick(H_STAGE, "stage"), None) if source not in IdentitySource.UNNAMED else None
    return Identity(
        program_id=program,
        stage=0 if source == IdentitySource.NEW else stage,
        workflow=(pick(H_WORKFLOW, "workflow") or "").strip() or DEFAULT_WORKFLOW,
        source=source,
        request_id=(pick(H_REQUEST, "request_id") or "").strip(),
        timeout_ms=_int("timeout_ms", pick(H_TIMEOUT, "timeout_ms"), 0, MAX_TIMEOUT_MS) or 0,
    )


def chat_messages(body: ChatCompletionRequest) -> tuple[ChatMessage, ...]:
    out = []
    for i, m in enumerate(body.messages):
        if m.content is None or isinstance(m.content, str):
            text = m.content or ""
        else:
            if any(p.type != "text" for p in m.content):
                raise InvalidRequest(f"messages[{i}].content: only text parts are supported")
            text = "".join(p.text or "" for p in m.content)
        calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or ())
        # "developer" is OpenAI's newer name for the system role.
        role = "system" if m.role == "developer" else m.role
        out.append(ChatMessage(role, text, calls, m.tool_call_id or "", m.name or ""))
    return tuple(out)


def prompt_messages(body: CompletionRequest) -> tuple[ChatMessage, ...]:
    if isinstance(body.prompt, list):
        if len(body.prompt) != 1:
            raise InvalidRequest("prompt: exactly one prompt per request is supported")
        return (ChatMessage("user", body.prompt[0]),)
    return (ChatMessage("user", body.prompt),)
