"""Frozen results and inputs of the SDK; protobuf never leaks out of ``chimera_client``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call of an answer (``Completion.tool_calls``), or of an assistant turn sent back."""

    id: str
    name: str
    arguments: str  # a JSON object as text


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A streamed piece of tool call ``index``: id and name with its first piece, then argument pieces."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class Message:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant turn's calls
    tool_call_id: str = ""  # a "tool" turn: the call it answers


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call; ``parameters`` is its arguments' JSON Schema."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] | None = None
    strict: bool = False

    @staticmethod
    def from_openai(function: Mapping[str, Any]) -> Tool:
        """From an OpenAI tool's ``function`` object (what the frameworks' converters make)."""
        return Tool(
            function["name"],
            function.get("description", ""),
            function.get("parameters"),
            bool(function.get("strict")),
        )


@dataclass(frozen=True, slots=True)
class Tools:
    """The tools of a stage and how the model may use them: ``choice`` is "auto", "none", "required" or
    the name of the one function it must call."""

    functions: tuple[Tool, ...]
    choice: str = "auto"
    parallel: bool = True


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """The shape the answer's text must have: "json_object", or "json_schema" with ``schema``."""

    type: str = "json_schema"
    schema: Mapping[str, Any] = field(default_factory=dict)
    name: str = "response"
    strict: bool = True


# A message as callers like to write it: Message, ("user", "text"), {"role": ..., "content": ...}, or a
# bare string (a user message).
MessageLike = Message | tuple[str, str] | Mapping[str, str] | str


def to_messages(items: Iterable[MessageLike] | str) -> tuple[Message, ...]:
    if isinstance(items, str):
        return (Message("user", items),)
    out = []
    for m in items:
        if isinstance(m, Message):
            out.append(m)
        elif isinstance(m, str):
            out.append(Message("user", m))
        elif isinstance(m, tuple):
            out.append(Message(m[0], m[1]))
        else:
            out.append(Message(str(m["role"]), str(m["content"])))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Sampling:
    max_tokens: int = 0  # 0: the dispatcher's default
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # None: the model's default (its generation config), else vLLM's neutral value.
    top_k: int | None = None  # 0 or -1: off
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of streamed text. A higher ``attempt`` than seen before means the request was re-run after
    its worker died: discard the text of earlier attempts (``Completion.text`` is always the winner's)."""

    text: str
    attempt: int
    tool_calls: tuple[ToolCallDelta, ...] = ()


@dataclass(frozen=True, slots=True)
class DispatchTimings:
    """Where a stage's ``dispatch_ms`` went (ms): router, predictor, the policy and its Redis round trips."""

    router_ms: float = 0.0
    predictor_ms: float = 0.0
    policy_ms: float = 0.0
    redis_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class Completion:
    request_id: str
    text: str
    finish_reason: str  # "stop" | "length" | "cancelled" | "tool_calls"
    prompt_tokens: int
    completion_tokens: int
    model: str
    engine: str
    queue_wait_s: float
    e2e_s: float
    predicted_tokens: int
    predicted_tokens_p90: int
    attempts: int
    dispatch_ms: float
    dispatch_timings: DispatchTimings = DispatchTimings()
    # The engine the policy chose when its queue was full and this workflow went to ``engine`` instead.
    browned_out_from: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    cached_prompt_tokens: int = 0  # of prompt_tokens, those the engine's prefix cache held


@dataclass(frozen=True, slots=True)
class ProgramEnd:
    found: bool
    cancelled_requests: int


@dataclass(frozen=True, slots=True)
class EngineStatus:
    engine_id: str
    alive: bool
    queued: int
    running: int
    inflight_tokens: int
    decode_ms_per_token: float
    max_batch_size: int


@dataclass(frozen=True, slots=True)
class ModelStatus:
    name: str
    engines: tuple[EngineStatus, ...]
