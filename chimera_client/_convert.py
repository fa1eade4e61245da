"""Protobuf <-> SDK dataclasses, shared by the sync and async clients."""

from __future__ import annotations

import json

from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from chimera_client.types import (
    Completion,
    DispatchTimings,
    EngineStatus,
    Message,
    ModelStatus,
    ProgramEnd,
    ResponseFormat,
    Sampling,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    Tools,
)

_MODES = ("auto", "none", "required")


def _message(m: Message) -> pb.ChatMessage:
    calls = [pb.ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in m.tool_calls]
    return pb.ChatMessage(role=m.role, content=m.content, tool_calls=calls, tool_call_id=m.tool_call_id)


def _tools(req: pb.GenerateRequest, tools: Tools) -> None:
    for t in tools.functions:
        params = json.dumps(dict(t.parameters)) if t.parameters is not None else ""
        req.tools.append(
            pb.Tool(name=t.name, description=t.description, parameters_json=params, strict=t.strict)
        )
    if tools.choice in _MODES:
        req.tool_choice.mode = tools.choice
    else:
        req.tool_choice.mode, req.tool_choice.function = "function", tools.choice
    req.parallel_tool_calls = tools.parallel


def _format(f: ResponseFormat) -> pb.ResponseFormat:
    schema = json.dumps(dict(f.schema)) if f.type == "json_schema" else ""
    return pb.ResponseFormat(type=f.type, schema_json=schema, name=f.name, strict=f.strict)


def generate_request(
    messages: tuple[Message, ...],
    *,
    program_id: str,
    stage: int,
    workflow: str,
    model: str,
    sampling: Sampling,
    request_id: str | None,
    timeout_s: float | None,
    tools: Tools | None = None,
    response_format: ResponseFormat | None = None,
    final_only: bool = False,
) -> pb.GenerateRequest:
    s = pb.SamplingParams(
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        stop=list(sampling.stop),
    )
    for name in ("top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
        if (value := getattr(sampling, name)) is not None:
            setattr(s, name, value)
    if sampling.seed is not None:
        s.seed = sampling.seed
    req = pb.GenerateRequest(
        program_id=program_id,
        stage=stage,
        workflow=workflow,
        messages=[_message(m) for m in messages],
        sampling=s,
        request_id=request_id or "",
        timeout_ms=int(timeout_s * 1000) if timeout_s else 0,
        model=model,
        final_only=final_only,
    )
    if tools is not None:
        _tools(req, tools)
    if response_format is not None:
        req.response_format.CopyFrom(_format(response_format))
    return req


def call_timeout(timeout_s: float | None, default_s: float | None) -> float | None:
    """The gRPC deadline: a little past the request's own, so the server's DEADLINE_EXCEEDED (which
    cancels the request) wins over the client giving up."""
    return timeout_s + 5.0 if timeout_s else default_s


def event(resp: pb.GenerateResponse) -> TextDelta | Completion:
    if resp.HasField("delta"):
        d = resp.delta
        pieces = tuple(ToolCallDelta(p.index, p.id, p.name, p.arguments) for p in d.tool_calls)
        return TextDelta(d.text, d.attempt, pieces)
    f = resp.final
    return Completion(
        request_id=f.request_id,
        text=f.text,
        finish_reason=f.finish_reason,
        prompt_tokens=f.usage.prompt_tokens,
        completion_tokens=f.usage.completion_tokens,
        cached_prompt_tokens=f.usage.cached_prompt_tokens,
        model=f.model,
        engine=f.engine,
        queue_wait_s=f.queue_wait_s,
        e2e_s=f.e2e_s,
        predicted_tokens=f.predicted_tokens,
        predicted_tokens_p90=f.predicted_tokens_p90,
        attempts=f.attempts,
        dispatch_ms=f.dispatch_ms,
        dispatch_timings=DispatchTimings(
            router_ms=f.dispatch_timings.router_ms,
            predictor_ms=f.dispatch_timings.predictor_ms,
            policy_ms=f.dispatch_timings.policy_ms,
            redis_ms=f.dispatch_timings.redis_ms,
        ),
        browned_out_from=f.browned_out_from,
        tool_calls=tuple(ToolCall(c.id, c.name, c.arguments) for c in f.tool_calls),
    )


def end_request(program_id: str, outcome: float | None) -> pb.EndProgramRequest:
    req = pb.EndProgramRequest(program_id=program_id)
    if outcome is not None:
        req.outcome = outcome
    return req


def program_end(resp: pb.EndProgramResponse) -> ProgramEnd:
    return ProgramEnd(found=resp.found, cancelled_requests=resp.cancelled_requests)


def models(resp: pb.ListModelsResponse) -> tuple[ModelStatus, ...]:
    return tuple(
        ModelStatus(
            name=m.name,
            engines=tuple(
                EngineStatus(
                    engine_id=e.engine_id,
                    alive=e.alive,
                    queued=e.queued,
                    running=e.running,
                    inflight_tokens=e.inflight_tokens,
                    decode_ms_per_token=e.decode_ms_per_token,
                    max_batch_size=e.max_batch_size,
                )
                for e in m.engines
            ),
        )
        for m in resp.models
    )
