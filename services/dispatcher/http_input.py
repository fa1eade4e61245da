"""What the HTTP door takes in, before the shared intake: the door's gate, the body-size guard, headers
and ``metadata`` as a workflow identity, OpenAI messages as Chimera's. Pure apart from the ASGI guards.

NOTE(identity): a workflow is named by headers (``X-Chimera-Program-Id``, ``X-Chimera-Stage``,
``X-Chimera-Workflow``) or by the same names in the request's ``metadata`` (``program_id``, ``stage``,
``workflow``); headers win. A request without a program id is a one-stage workflow: it gets a fresh program
id and its program is ended as soon as it finishes, so nothing lingers in the program table. A request with
a program id but no stage is the program's next stage (its last stage + 1, or 0 for a new program), which
lets a framework that can only set one header still run a multi-stage workflow.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.common.chat import ToolCall
from services.common.types import ChatMessage
from services.dispatcher.door import DoorGate
from services.dispatcher.errors import InvalidRequest, Overloaded, RequestTooLarge
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
    one_shot: bool
    request_id: str  # "": the dispatcher makes one
    timeout_ms: int


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


def resolve_identity(headers: Mapping[str, str], metadata: Mapping[str, str] | None) -> Identity:
    """Workflow identity from headers, else metadata, else a fresh one-stage workflow (pure)."""
    meta = metadata or {}

    def pick(header: str, key: str) -> str | None:
        value = headers.get(header)
        return value if value is not None else meta.get(key)

    program = (pick(H_PROGRAM, "program_id") or "").strip()
    one_shot = not program
    return Identity(
        program_id=program or f"http-{uuid.uuid4().hex}",
        stage=0 if one_shot else _int("stage", pick(H_STAGE, "stage"), None),
        workflow=(pick(H_WORKFLOW, "workflow") or "").strip() or DEFAULT_WORKFLOW,
        one_shot=one_shot,
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
