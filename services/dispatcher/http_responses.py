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
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from services.common.chat import ResponseFormat, Tool, ToolCall, ToolUse
from services.common.types import ChatMessage, SamplingParams
from services.dispatcher.errors import DispatchError, InvalidRequest
from services.dispatcher.handoff import Delta, Dispatched, Final
from services.dispatcher.http_input import Identity, check_metadata, resolve_identity
from services.dispatcher.intake import Intake
from services.dispatcher.openai_fields import Refused, check_refused
from services.dispatcher.openai_schema import domain_error, usage
from services.dispatcher.tenancy import client_id

_REFUSED = {
    "previous_response_id": Refused(lambda v: v is None, "absent: Chimera keeps no conversation state"),
    "conversation": Refused(lambda v: v is None, "absent: Chimera keeps no conversation state"),
    "reasoning": Refused(lambda v: v is None, "absent"),
    "background": Refused(lambda v: v in (None, False), "absent or false"),
}


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class FunctionToolIn(_Lenient):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedChoice(_Lenient):
    type: Literal["function"]
    name: str


class TextFormatIn(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    name: str = "response"
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


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
        if not self.tools and self.tool_choice is None:
            return None
        tools = tuple(
            Tool(
                t.name,
                t.description or "",
                json.dumps(t.parameters) if t.parameters is not None else "",
                bool(t.strict),
            )
            for t in self.tools or ()
        )
        parallel = self.parallel_tool_calls is not False
        if isinstance(self.tool_choice, NamedChoice):
            return ToolUse(tools, "function", self.tool_choice.name, parallel)
        return ToolUse(tools, self.tool_choice or ("auto" if tools else "none"), "", parallel)

    def format(self) -> ResponseFormat | None:
        f = self.text.format if self.text is not None else None
        if f is None or f.type == "text":
            return None
        if f.type == "json_object":
            return ResponseFormat("json_object")
        return ResponseFormat("json_schema", json.dumps(f.schema_), f.name, bool(f.strict))

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
                "input_tokens_details": {"cached_tokens": 0},
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
        ident = resolve_identity(request.headers, body.metadata)
        intake = Intake(
            program_id=ident.program_id,
            stage=ident.stage,
            workflow=ident.workflow,
            messages=body.messages(),
            sampling=body.sampling(),
            model=body.model,
            request_id=ident.request_id,
            timeout_ms=ident.timeout_ms,
            last_stage=ident.one_shot,
            tool_use=body.tool_use(),
            response_format=body.format(),
        )
        dispatched, headers = await self._door.submit(intake, ident, tenant)
        rid = f"resp_{client_id(dispatched.request.request_id)}"
        msg_id = f"msg_{uuid.uuid4().hex}"
        if body.stream:
            events = self._events(body, dispatched, ident, rid, msg_id)
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)
        final = await self._door.final_of(dispatched, ident, request)
        if final is None:
            return Response(status_code=499)
        return JSONResponse(response_body(body, rid, int(time.time()), final, msg_id), headers=headers)

    async def _events(
        self, body: ResponsesRequest, d: Dispatched, ident: Identity, rid: str, msg_id: str
    ) -> AsyncIterator[str]:
        """Responses stream events: the text as ``output_text.delta``s of one message item, then each call
        as a ``function_call`` item, then ``response.completed`` with the whole response. A re-run's text
        (a worker died) is not streamed: the completed response carries the answer that won."""
        seq = iter(range(1 << 62))
        created = int(time.time())

        def event(kind: str, **fields: Any) -> str:
            data = {"type": kind, "sequence_number": next(seq), **fields}
            return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"

        pending = response_body(body, rid, created, None, msg_id)
        yield event("response.created", response=pending)
        yield event("response.in_progress", response=pending)
        text, first_attempt, opened = "", 0, False
        message = {
            "type": "message",
            "id": msg_id,
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        try:
            async for item in self._door.dispatcher.stream(d):
                if isinstance(item, Delta):
                    first_attempt = first_attempt or item.attempt
                    if item.attempt != first_attempt or not item.text:
                        continue
                    if not opened:
                        opened = True
                        yield event("response.output_item.added", output_index=0, item=message)
                        part = {"type": "output_text", "text": "", "annotations": []}
                        yield event(
                            "response.content_part.added",
                            item_id=msg_id,
                            output_index=0,
                            content_index=0,
                            part=part,
                        )
                    text += item.text
                    yield event(
                        "response.output_text.delta",
                        item_id=msg_id,
                        output_index=0,
                        content_index=0,
                        delta=item.text,
                        logprobs=[],
                    )
                    continue
                done = response_body(body, rid, created, item, msg_id)
                for index, out in enumerate(done["output"]):
                    if out["type"] == "message":
                        if not opened:
                            yield event("response.output_item.added", output_index=index, item=message)
                            part = {"type": "output_text", "text": "", "annotations": []}
                            yield event(
                                "response.content_part.added",
                                item_id=msg_id,
                                output_index=index,
                                content_index=0,
                                part=part,
                            )
                        rest = item.text[len(text) :] if item.text.startswith(text) else ""
                        if rest:
                            yield event(
                                "response.output_text.delta",
                                item_id=msg_id,
                                output_index=index,
                                content_index=0,
                                delta=rest,
                                logprobs=[],
                            )
                        yield event(
                            "response.output_text.done",
                            item_id=msg_id,
                            output_index=index,
                            content_index=0,
                            text=item.text,
                            logprobs=[],
                        )
                        yield event(
                            "response.content_part.done",
                            item_id=msg_id,
                            output_index=index,
                            content_index=0,
                            part=out["content"][0],
                        )
                    else:
                        added = {**out, "arguments": "", "status": "in_progress"}
                        yield event("response.output_item.added", output_index=index, item=added)
                        yield event(
                            "response.function_call_arguments.delta",
                            item_id=out["id"],
                            output_index=index,
                            delta=out["arguments"],
                        )
                        yield event(
                            "response.function_call_arguments.done",
                            item_id=out["id"],
                            output_index=index,
                            arguments=out["arguments"],
                            name=out["name"],
                        )
                    yield event("response.output_item.done", output_index=index, item=out)
                yield event("response.completed", response=done)
        except DispatchError as e:
            _, err = domain_error(e.code, str(e))
            yield event("error", code=err["error"]["code"], message=err["error"]["message"], param=None)
        finally:
            if ident.one_shot:
                await self._door.end_quietly(d.request.program_id)
