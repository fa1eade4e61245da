"""``POST /v1/responses``: OpenAI's Responses API on the HTTP door, for clients whose default model speaks it
(the OpenAI Agents SDK's). Text and function calls, streamed (Responses events) and not.

A Responses request maps into the same typed form as a chat completion (messages with tool calls and tool
results, ``ToolUse``, ``ResponseFormat``, ``SamplingParams``) and runs as one stage, its workflow identity
from the same headers or ``metadata``. Chimera keeps no conversation state on the server, so
``previous_response_id`` and ``conversation`` are refused by name (send the whole input, as ``store=false``
clients do), as are input items other than messages, function calls and their outputs.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from services.common.chat import ResponseFormat, ToolCall, ToolUse, openai_tool_use
from services.common.types import ChatMessage, SamplingParams
from services.dispatcher.errors import DispatchError, InvalidRequest
from services.dispatcher.handoff import Delta, Dispatched, Final
from services.dispatcher.http_input import Identity, check_metadata
from services.dispatcher.intake import Intake
from services.dispatcher.openai_fields import Refused, check_refused
from services.dispatcher.openai_schema import FunctionIn, JsonSchemaIn, domain_error, usage
from services.dispatcher.tenancy import client_id

_REFUSED = {
    "previous_response_id": Refused(lambda v: v is None, "absent: Chimera keeps no conversation state"),
    "conversation": Refused(lambda v: v is None, "absent: Chimera keeps no conversation state"),
    "reasoning": Refused(lambda v: v is None, "absent"),
    "background": Refused(lambda v: v in (None, False), "absent or false"),
}


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class FunctionToolIn(FunctionIn):
    """The Responses API's tool: the chat API's function, flattened beside its type."""

    type: Literal["function"]


class NamedChoice(_Lenient):
    type: Literal["function"]
    name: str


class TextFormatIn(JsonSchemaIn):
    """The Responses API's ``text.format``: the chat API's json_schema, flattened beside its type."""

    type: Literal["text", "json_object", "json_schema"]


class TextConfigIn(_Lenient):
    format: TextFormatIn | None = None


class ResponsesRequest(_Lenient):
    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[FunctionToolIn] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    text: TextConfigIn | None = None
    stream: bool = False
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = Field(default=None, max_length=1024)  # a session id (as chat's)
    previous_response_id: Any = None
    conversation: Any = None
    reasoning: Any = None
    background: Any = None

    @field_validator(*_REFUSED, mode="before")
    @classmethod
    def _refused(cls, v: Any, info: Any) -> Any:
        return check_refused(_REFUSED, info.field_name, v)

    def messages(self) -> tuple[ChatMessage, ...]:
        out = [ChatMessage("system", self.instructions)] if self.instructions else []
        items = [{"role": "user", "content": self.input}] if isinstance(self.input, str) else self.input
        for i, item in enumerate(items):
            kind = item.get("type", "message")
            if kind == "message":
                role = "system" if item.get("role") == "developer" else str(item.get("role", "user"))
                out.append(ChatMessage(role, _text(item.get("content"), i)))
            elif kind == "function_call":
                call = ToolCall(
                    str(item.get("call_id", "")), str(item.get("name", "")), str(item.get("arguments", "{}"))
                )
                last = out[-1] if out else None
                if last is not None and last.role == "assistant":  # calls of one turn stay together
                    out[-1] = ChatMessage("assistant", last.content, (*last.tool_calls, call))
                else:
                    out.append(ChatMessage("assistant", "", (call,)))
            elif kind == "function_call_output":
                output = item.get("output", "")
                text = output if isinstance(output, str) else _text(output, i)
                out.append(ChatMessage("tool", text, tool_call_id=str(item.get("call_id", ""))))
            else:
                raise InvalidRequest(f"input[{i}].type {kind!r} is not supported by Chimera yet")
        return tuple(out)

    def tool_use(self) -> ToolUse | None:
        tools = tuple(t.tool() for t in self.tools or ())
        choice = self.tool_choice
        if isinstance(choice, NamedChoice):
            return openai_tool_use(tools, None, choice.name, self.parallel_tool_calls)
        return openai_tool_use(tools, choice, "", self.parallel_tool_calls)

    def format(self) -> ResponseFormat | None:
        f = self.text.format if self.text is not None else None
        if f is None or f.type == "text":
            return None
        if f.type == "json_object":
            return ResponseFormat("json_object")
        return f.format()

    def sampling(self) -> SamplingParams:
        limit = self.max_output_tokens
        return SamplingParams(
            max_tokens=limit or 0, to_context=limit is None, temperature=self.temperature, top_p=self.top_p
        )


def _text(content: Any, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if part.get("type") not in ("input_text", "output_text", "text"):
            raise InvalidRequest(f"input[{i}].content: only text parts are supported")
        parts.append(str(part.get("text", "")))
    return "".join(parts)


def _output(f: Final, message_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if f.text or not f.tool_calls:
        text = {"type": "output_text", "text": f.text, "annotations": []}
        items.append(
            {
                "type": "message",
                "id": message_id,
                "status": "completed",
                "role": "assistant",
                "content": [text],
            }
        )
    for c in f.tool_calls:
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{c.id}",
                "call_id": c.id,
                "name": c.name,
                "arguments": c.arguments,
                "status": "completed",
            }
        )
    return items


def response_body(
    body: ResponsesRequest, response_id: str, created: int, f: Final | None, msg_id: str
) -> dict[str, Any]:
    """A ``response`` object: in progress (``f`` None) or finished with ``f``."""
    out: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": "in_progress",
        "model": body.model,
        "output": [],
        "tools": [t.model_dump(by_alias=True, exclude_none=True) for t in body.tools or ()],
        "tool_choice": body.tool_choice.model_dump()
        if isinstance(body.tool_choice, NamedChoice)
        else body.tool_choice or "auto",
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "incomplete_details": None,
        "error": None,
        "metadata": body.metadata or {},
    }
    if f is not None:
        u = usage(f)
        out.update(
            model=f.model,
            status="incomplete" if f.finish_reason == "length" else "completed",
            incomplete_details={"reason": "max_output_tokens"} if f.finish_reason == "length" else None,
            output=_output(f, msg_id),
            usage={
                "input_tokens": u["prompt_tokens"],
                "output_tokens": u["completion_tokens"],
                "total_tokens": u["total_tokens"],
                "input_tokens_details": {"cached_tokens": f.cached_prompt_tokens},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        )
    return out


class ResponsesEndpoint:
    def __init__(self, door: Any) -> None:
        self._door = door  # the OpenAIFrontDoor: its dispatch, waiting and one-stage ending

    async def create(self, body: ResponsesRequest, request: Request) -> Response:
        d = self._door.dispatcher
        tenant = (await d.auth.principal(request.headers.get("authorization"))).tenant
        check_metadata(body.metadata, d.settings.max_metadata_chars)
        messages, tool_use = body.messages(), body.tool_use()
        ident = await self._door.programs.identify(
            tenant, request.headers, body.metadata, body.prompt_cache_key, body.model, messages
        )
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
            response_format=body.format(),
            stream=body.stream,
            identity=ident.source,
        )
        dispatched, headers = await self._door.submit(intake, ident, tenant)
        rid = f"resp_{client_id(dispatched.request.request_id)}"
        msg_id = f"msg_{uuid.uuid4().hex}"
        if body.stream:
            events = self._events(body, dispatched, ident, tenant, rid, msg_id)
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)
        final = await self._door.final_of(dispatched, ident, tenant, request)
        if final is None:
            return Response(status_code=499)
        return JSONResponse(response_body(body, rid, int(time.time()), final, msg_id), headers=headers)

    async def _events(
        self, body: ResponsesRequest, d: Dispatched, ident: Identity, tenant: str, rid: str, msg_id: str
    ) -> AsyncIterator[str]:
        """Responses stream events: the text as ``output_text.delta``s of one message item, then each call
        as a ``function_call`` item, then ``response.completed`` with the whole response. A re-run's text
        (a worker died) is not streamed: the completed response carries the answer that won."""
        created = int(time.time())
        ev = _Events(msg_id)
        pending = response_body(body, rid, created, None, msg_id)
        yield ev.event("response.created", response=pending)
        yield ev.event("response.in_progress", response=pending)
        first_attempt = 0
        told = False  # the program was told how the stream ended
        try:
            async for item in self._door.dispatcher.stream(d):
                if isinstance(item, Delta):
                    first_attempt = first_attempt or item.attempt
                    if item.attempt == first_attempt and item.text:
                        for e in ev.text(item.text):
                            yield e
                    continue
                told = True  # before the caller sees the end (the chat stream's reason)
                await self._door.programs.finished(ident, tenant, d, item)
                for e in ev.finish(response_body(body, rid, created, item, msg_id), item.text):
                    yield e
        except DispatchError as e:
            _, err = domain_error(e.code, str(e))
            yield ev.event("error", code=err["error"]["code"], message=err["error"]["message"], param=None)
        finally:
            if not told:
                await self._door.programs.finished(ident, tenant, d, None)


class _Events:
    """The events of one streamed response, numbered in order; the message item opens with its first text."""

    def __init__(self, msg_id: str) -> None:
        self._seq = iter(range(1 << 62))
        self._msg_id = msg_id
        self._sent = ""
        self._opened = False

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": next(self._seq), **fields}
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"

    def _on_text(self, kind: str, index: int, **fields: Any) -> str:
        """An event of the message item's one text part."""
        return self.event(kind, item_id=self._msg_id, output_index=index, content_index=0, **fields)

    def _open(self, index: int) -> Iterator[str]:
        if self._opened:
            return
        self._opened = True
        message = {
            "type": "message",
            "id": self._msg_id,
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        yield self.event("response.output_item.added", output_index=index, item=message)
        part = {"type": "output_text", "text": "", "annotations": []}
        yield self._on_text("response.content_part.added", index, part=part)

    def text(self, delta: str) -> Iterator[str]:
        yield from self._open(0)
        self._sent += delta
        yield self._on_text("response.output_text.delta", 0, delta=delta, logprobs=[])

    def finish(self, done: dict[str, Any], text: str) -> Iterator[str]:
        """The rest of the text, each call, every item's end, then ``response.completed``."""
        for index, out in enumerate(done["output"]):
            if out["type"] == "message":
                yield from self._open(index)
                rest = text[len(self._sent) :] if text.startswith(self._sent) else ""
                if rest:
                    yield self._on_text("response.output_text.delta", index, delta=rest, logprobs=[])
                yield self._on_text("response.output_text.done", index, text=text, logprobs=[])
                yield self._on_text("response.content_part.done", index, part=out["content"][0])
            else:
                added = {**out, "arguments": "", "status": "in_progress"}
                yield self.event("response.output_item.added", output_index=index, item=added)
                at = {"item_id": out["id"], "output_index": index}
                yield self.event("response.function_call_arguments.delta", **at, delta=out["arguments"])
                yield self.event(
                    "response.function_call_arguments.done",
                    **at,
                    arguments=out["arguments"],
                    name=out["name"],
                )
            yield self.event("response.output_item.done", output_index=index, item=out)
        yield self.event("response.completed", response=done)
