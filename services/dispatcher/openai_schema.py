"""The OpenAI wire format the HTTP front door speaks: request models, response bodies, error bodies.

What Chimera honours is modelled; a field of OpenAI's API it cannot honour yet is declared too and refused
by name unless it has its neutral value (services.dispatcher.openai_fields), as is a value Chimera would get
wrong (``n`` > 1). Fields outside OpenAI's API are ignored, as OpenAI's server ignores them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from services.common.chat import ResponseFormat, Tool, ToolCallPiece, ToolUse, openai_tool_use
from services.common.types import SamplingParams
from services.dispatcher.handoff import Final
from services.dispatcher.openai_fields import (
    CHAT_REFUSED,
    SAMPLING_REFUSED,
    TEXT_REFUSED,
    Refused,
    check_refused,
)
from services.dispatcher.tenancy import client_id

# Domain error code (a gRPC status name) -> (HTTP status, OpenAI error type). One table, used everywhere.
HTTP_ERRORS: Mapping[str, tuple[int, str]] = {
    "INVALID_ARGUMENT": (400, "invalid_request_error"),
    "UNAUTHENTICATED": (401, "authentication_error"),
    "PERMISSION_DENIED": (403, "permission_error"),
    "RESOURCE_EXHAUSTED": (413, "invalid_request_error"),
    "NOT_FOUND": (404, "invalid_request_error"),
    "ALREADY_EXISTS": (409, "conflict_error"),
    "FAILED_PRECONDITION": (409, "conflict_error"),
    "UNAVAILABLE": (503, "service_unavailable_error"),
    "DEADLINE_EXCEEDED": (504, "timeout_error"),
    "CANCELLED": (499, "cancelled_error"),
    "INTERNAL": (500, "server_error"),
}


def _refusing(table: Mapping[str, Refused]) -> Any:
    """A validator of every field in ``table``: its value if neutral, else a 400 naming the field."""

    def check(cls: Any, v: Any, info: ValidationInfo) -> Any:
        assert info.field_name is not None
        return check_refused(table, info.field_name, v)

    return field_validator(*table, mode="before")(check)


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ContentPart(_Lenient):
    type: str
    text: str | None = None


class ToolCallFunctionIn(_Lenient):
    name: str
    arguments: str = "{}"


class ToolCallIn(_Lenient):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: ToolCallFunctionIn


class ChatMessageIn(_Lenient):
    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class FunctionIn(_Lenient):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def tool(self) -> Tool:
        params = json.dumps(self.parameters) if self.parameters is not None else ""
        return Tool(self.name, self.description or "", params, bool(self.strict))


class ToolIn(_Lenient):
    type: Literal["function"]
    function: FunctionIn


class NamedFunction(_Lenient):
    name: str


class NamedToolChoice(_Lenient):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaIn(_Lenient):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None

    def format(self) -> ResponseFormat:
        return ResponseFormat("json_schema", json.dumps(self.schema_), self.name, bool(self.strict))


class ResponseFormatIn(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaIn | None = None


class StreamOptions(_Lenient):
    include_usage: bool = False


class _GenerationRequest(_Lenient):
    model: str = Field(min_length=1, description='"auto" lets Chimera choose; a model name pins it')
    max_tokens: int | None = Field(default=None, ge=1)
    # Unset or null: the model's default, as vllm serve takes it (its generation config, else OpenAI's 1.0).
    # The gRPC API's default temperature is 0 (greedy), a deliberate difference.
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = Field(default=None, ge=0, lt=2**64)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=1, description="one choice per request: a stage has one answer")
    stream: bool = False
    stream_options: StreamOptions | None = None
    metadata: dict[str, str] | None = None
    # OpenAI's cache-grouping key; agent clients set it to their session id, which Chimera takes as the
    # program's identity when no Chimera header or metadata names one (http_input's NOTE(identity)).
    prompt_cache_key: str | None = Field(default=None, max_length=1024)
    # vLLM's sampling fields, as vllm serve takes them.
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: Any = None

    _sampling_refused = _refusing(SAMPLING_REFUSED)

    def sampling(self) -> SamplingParams:
        """The sampling fields as the intake takes them: no max_tokens means the rest of the context (as
        vllm serve), max_tokens 0 standing for the dispatcher's default in its estimates."""
        limit = self.token_limit()
        return SamplingParams(
            max_tokens=limit or 0,
            to_context=limit is None,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=self.stop_sequences(),
            top_k=self.top_k,
            min_p=self.min_p,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
        )

    def token_limit(self) -> int | None:
        return self.max_tokens

    def stop_sequences(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessageIn]
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[ToolIn] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: Any = None
    function_call: Any = None
    response_format: ResponseFormatIn | None = None
    logprobs: Any = None
    top_logprobs: Any = None
    prediction: Any = None
    audio: Any = None
    modalities: Any = None

    _chat_refused = _refusing(CHAT_REFUSED)

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def tool_use(self) -> ToolUse | None:
        """The tools and the choice, as OpenAI defaults them: "auto" with tools, "none" without."""
        tools = tuple(t.function.tool() for t in self.tools or ())
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice):
            return openai_tool_use(tools, None, choice.function.name, self.parallel_tool_calls)
        return openai_tool_use(tools, choice, "", self.parallel_tool_calls)

    def format(self) -> ResponseFormat | None:
        f = self.response_format
        if f is None or f.type == "text":
            return None
        if f.type == "json_object":
            return ResponseFormat("json_object")
        return (f.json_schema or JsonSchemaIn()).format()


class CompletionRequest(_GenerationRequest):
    prompt: str | list[str]
    logprobs: Any = None
    echo: Any = None
    best_of: Any = None
    suffix: Any = None

    _text_refused = _refusing(TEXT_REFUSED)


Kind = Literal["chat", "text"]


def usage(f: Final) -> dict[str, Any]:
    return {
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
        # OpenAI's place for prefix-cache hits: what the engine that holds the program's prefix saved.
        "prompt_tokens_details": {"cached_tokens": f.cached_prompt_tokens},
    }


def chimera_info(f: Final, program_id: str, stage: int) -> dict[str, Any]:
    """Chimera's own fields, added beside OpenAI's (clients keep unknown fields)."""
    return {
        "program_id": program_id,
        "stage": stage,
        "request_id": client_id(f.request_id),
        "engine": f.engine,
        "queue_wait_s": f.queue_wait_s,
        "e2e_s": f.e2e_s,
        "predicted_tokens": f.predicted_tokens,
        "predicted_tokens_p90": f.predicted_tokens_p90,
        "attempts": f.attempts,
        "dispatch_ms": f.dispatch_ms,
        "browned_out_from": f.browned_out_from or None,
        "dispatch_timings_ms": {
            "router": f.timings.router_ms,
            "predictor": f.timings.predictor_ms,
            "policy": f.timings.policy_ms,
            "redis": f.timings.redis_ms,
        },
    }


def completion_body(kind: Kind, f: Final, program_id: str, stage: int) -> dict[str, Any]:
    """A whole (non-streamed) ``chat.completion`` or ``text_completion``."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": f.finish_reason, "logprobs": None}
    if kind == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": f.text}
        if f.tool_calls:
            message["content"] = f.text or None  # OpenAI's shape for an answer that is only calls
            message["tool_calls"] = [c.openai() for c in f.tool_calls]
        choice["message"] = message
    else:
        choice["text"] = f.text
    return {
        "id": response_id(kind, client_id(f.request_id)),
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": f.model,
        "choices": [choice],
        "usage": usage(f),
        "chimera": chimera_info(f, program_id, stage),
    }


def response_id(kind: Kind, request_id: str) -> str:
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{request_id}"


def chunk_body(
    kind: Kind,
    request_id: str,
    model: str,
    created: int,
    *,
    text: str | None = None,
    tool_calls: tuple[ToolCallPiece, ...] = (),
    role: bool = False,
    finish_reason: str | None = None,
    usage_of: Final | None = None,
    program_id: str = "",
    stage: int = 0,
) -> dict[str, Any]:
    """One streamed chunk. ``usage_of`` makes it the final usage-only chunk (``choices`` empty), which also
    carries Chimera's own fields, as a whole completion does."""
    body: dict[str, Any] = {
        "id": response_id(kind, request_id),
        "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
        "created": created,
        "model": model,
    }
    if usage_of is not None:
        body["choices"] = []
        body["usage"] = usage(usage_of)
        body["chimera"] = chimera_info(usage_of, program_id, stage)
        return body
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
    if kind == "chat":
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        if tool_calls:
            delta["tool_calls"] = [_piece(p) for p in tool_calls]
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    body["choices"] = [choice]
    return body


def _piece(p: ToolCallPiece) -> dict[str, Any]:
    """A tool call's streamed piece in OpenAI's shape: id, type and name only on its first piece."""
    out: dict[str, Any] = {"index": p.index}
    function: dict[str, Any] = {"arguments": p.arguments}
    if p.id:
        out["id"], out["type"] = p.id, "function"
    if p.name:
        function["name"] = p.name
    out["function"] = function
    return out


def error_body(message: str, err_type: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def domain_error(code: str, message: str) -> tuple[int, dict[str, Any]]:
    """HTTP status and body for a domain error code (a gRPC status name)."""
    status, err_type = HTTP_ERRORS.get(code, HTTP_ERRORS["INTERNAL"])
    param = "model" if code == "NOT_FOUND" else None
    return status, error_body(message or code, err_type, code.lower(), param)
