"""A request in OpenAI's chat-completions shape (arguments as text, OpenAI's field names): what vLLM's own
request model takes in-process (``vllm_chat``) and what a remote vLLM server takes over HTTP (``remote``)."""

from __future__ import annotations

from typing import Any

from services.common.types import ChatMessage, SamplingParams, StageRequest


def openai_messages(messages: tuple[ChatMessage, ...]) -> list[dict[str, Any]]:
    """The history in OpenAI's wire shape (arguments as text): what vLLM's request model and a remote
    vLLM server take."""
    out: list[dict[str, Any]] = []
    for m in messages:
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            d["tool_calls"] = [c.openai() for c in m.tool_calls]
        if m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        if m.name:
            d["name"] = m.name
        out.append(d)
    return out


def openai_fields(request: StageRequest) -> dict[str, Any]:
    """The request's tool and format fields in OpenAI's shape (absent when unset)."""
    fields: dict[str, Any] = {}
    use = request.tool_use
    if use is not None:
        if use.tools:
            fields["tools"] = [t.openai() for t in use.tools]
        fields["tool_choice"] = use.openai_choice()
        fields["parallel_tool_calls"] = use.parallel
    if request.response_format is not None:
        fields["response_format"] = request.response_format.openai()
    return fields


def sampling_fields(s: SamplingParams) -> dict[str, Any]:
    """The sampling fields in OpenAI's (and vLLM's request) names."""
    return {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "seed": s.seed,
        "stop": list(s.stop) or None,
        "top_k": s.top_k,
        "min_p": s.min_p,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "repetition_penalty": s.repetition_penalty,
    }
