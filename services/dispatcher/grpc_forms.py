"""The gRPC door's wire shapes mapped to the one typed form and back: a ``GenerateRequest`` becomes an
``Intake``; a ``Delta`` and a ``Final`` become a ``TextDelta`` and a ``Completion``.

proto3 has no "unset" for scalars, so a zero value means "the default" here, field by field, as the
proto's comments say.
"""

from __future__ import annotations

from typing import Any

from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from services.common.chat import FORMAT_TYPES, TOOL_CHOICE_MODES, ResponseFormat, Tool, ToolCall, ToolUse
from services.common.types import ChatMessage, SamplingParams
from services.dispatcher.errors import InvalidRequest
from services.dispatcher.handoff import Delta, Final
from services.dispatcher.intake import Intake
from services.dispatcher.tenancy import client_id


def _message(m: pb.ChatMessage) -> ChatMessage:
    calls = tuple(ToolCall(c.id, c.name, c.arguments) for c in m.tool_calls)
    return ChatMessage(m.role, m.content, calls, m.tool_call_id, m.name)


def _tool_use(msg: pb.GenerateRequest) -> ToolUse | None:
    mode = msg.tool_choice.mode or "auto"
    if mode not in TOOL_CHOICE_MODES:
        raise InvalidRequest(f"tool_choice.mode {mode!r} is not one of {sorted(TOOL_CHOICE_MODES)}")
    if not msg.tools and not msg.HasField("tool_choice"):
        return None
    tools = tuple(Tool(t.name, t.description, t.parameters_json, t.strict) for t in msg.tools)
    parallel = msg.parallel_tool_calls if msg.HasField("parallel_tool_calls") else True
    return ToolUse(tools, mode, msg.tool_choice.function, parallel)  # type: ignore[arg-type]


def _response_format(f: pb.ResponseFormat) -> ResponseFormat | None:
    kind = f.type or "text"
    if kind not in FORMAT_TYPES:
        raise InvalidRequest(f"response_format.type {kind!r} is not one of {sorted(FORMAT_TYPES)}")
    if kind == "text":
        return None
    return ResponseFormat(kind, f.schema_json, f.name, f.strict)  # type: ignore[arg-type]


# The SamplingParams fields proto3 marks optional: unset is None (the model's default).
_OPTIONAL = ("seed", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")


def _sampling(s: pb.SamplingParams) -> SamplingParams:
    """max_tokens 0 stays 0 (the dispatcher's default) and top_p 0 is 1.0; temperature 0 is greedy."""
    unset: dict[str, Any] = {name: getattr(s, name) if s.HasField(name) else None for name in _OPTIONAL}
    return SamplingParams(max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p or 1.0,
                          stop=tuple(s.stop), **unset)  # fmt: skip


def intake_of(msg: pb.GenerateRequest) -> Intake:
    """A GenerateRequest as the intake takes it: proto3's zero values are "unset"."""
    return Intake(
        program_id=msg.program_id,
        stage=msg.stage,
        workflow=msg.workflow,
        messages=tuple(_message(m) for m in msg.messages),
        sampling=_sampling(msg.sampling),
        model=msg.model,
        request_id=msg.request_id,
        timeout_ms=msg.timeout_ms,
        tool_use=_tool_use(msg),
        response_format=_response_format(msg.response_format),
        stream=not msg.final_only,
    )


def text_delta(d: Delta) -> pb.TextDelta:
    pieces = [
        pb.ToolCallDelta(index=p.index, id=p.id, name=p.name, arguments=p.arguments) for p in d.tool_calls
    ]
    return pb.TextDelta(text=d.text, attempt=d.attempt, tool_calls=pieces)


def completion(f: Final) -> pb.Completion:
    return pb.Completion(
        request_id=client_id(f.request_id),
        text=f.text,
        finish_reason=f.finish_reason,
        usage=pb.Usage(
            prompt_tokens=f.prompt_tokens,
            completion_tokens=f.completion_tokens,
            cached_prompt_tokens=f.cached_prompt_tokens,
        ),
        model=f.model,
        engine=f.engine,
        queue_wait_s=f.queue_wait_s,
        e2e_s=f.e2e_s,
        predicted_tokens=f.predicted_tokens,
        predicted_tokens_p90=f.predicted_tokens_p90,
        attempts=f.attempts,
        dispatch_ms=f.dispatch_ms,
        dispatch_timings=pb.DispatchTimings(
            router_ms=f.timings.router_ms,
            predictor_ms=f.timings.predictor_ms,
            policy_ms=f.timings.policy_ms,
            redis_ms=f.timings.redis_ms,
        ),
        browned_out_from=f.browned_out_from,
        tool_calls=[pb.ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in f.tool_calls],
    )
