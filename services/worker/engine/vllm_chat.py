"""A chat request with tools or a structured-output format, put to an in-process vLLM engine with vLLM's own
parts: its ``ChatCompletionRequest`` turns our fields into ``SamplingParams`` (structured outputs included),
the tool parser configured for the engine (``ParserManager``, by the name ``vllm serve --tool-call-parser``
takes) adjusts it as ``vllm serve`` does (a ``required`` or named choice is enforced by a grammar, so the call
is always well-formed) and reads the calls out of the text, streamed and whole.

NOTE(same as vllm serve): nothing here decides how a model writes a call or how a call is forced: those are
vLLM's, so Chimera's tool-call success on a model is the success ``vllm serve --enable-auto-tool-choice
--tool-call-parser <name>`` has on it (bench/results/tools.md compares the two).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.common.chat import ToolCall, ToolCallPiece
from services.common.types import ChatMessage, StageRequest
from services.worker.engine.base import EngineRequestError
from services.worker.engine.openai_form import openai_fields, openai_messages, sampling_fields


def template_messages(messages: tuple[ChatMessage, ...]) -> list[dict[str, Any]]:
    """The history as chat templates take it: OpenAI's shape with each call's arguments as an object (the
    templates serialise them themselves)."""
    out = openai_messages(messages)
    for d in out:
        for call in d.get("tool_calls", ()):
            call["function"]["arguments"] = json.loads(call["function"]["arguments"] or "{}")
    return out


def needs_chat_request(request: StageRequest) -> bool:
    """Tools or a format: the path through vLLM's request model; plain text keeps the direct one."""
    return request.tool_use is not None or request.response_format is not None


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ChatCall:
    """One request's vLLM request model and parser; ``pieces`` turns its streamed output into content and
    tool-call pieces, ``calls`` reads the whole output's calls at the end."""

    vreq: Any
    parser_cls: Any
    tokenizer: Any
    streaming: Any = None
    ids: dict[int, str] = field(default_factory=dict)  # call index -> the id its first piece carried
    raw: list[str] = field(default_factory=list)  # the whole output, for the final parse (tools only)

    @property
    def parses_tools(self) -> bool:
        return self.parser_cls is not None and self.vreq.tools and self.vreq.tool_choice != "none"

    def pieces(
        self, text: str, token_ids: list[int], prompt_ids: list[int], finished: bool
    ) -> tuple[str, tuple[ToolCallPiece, ...]]:
        if not self.parses_tools:
            return text, ()
        self.raw.append(text)
        if self.streaming is None:
            self.streaming = self.parser_cls(self.tokenizer, self.vreq.tools)
        msg = self.streaming.parse_delta(text, token_ids, self.vreq, prompt_ids, finished=finished)
        if msg is None:
            return "", ()
        out = []
        for tc in msg.tool_calls or ():
            fn = tc.function
            first = tc.index not in self.ids
            if first:
                self.ids[tc.index] = tc.id or call_id()
            out.append(
                ToolCallPiece(
                    tc.index,
                    self.ids[tc.index] if first else "",
                    (fn.name or "") if fn else "",
                    (fn.arguments or "") if fn else "",
                )
            )
        return msg.content or "", tuple(out)

    def whole(self, text: str) -> str:
        """A whole answer's content (not streamed: ``calls()`` then reads its calls); without tool parsing,
        the text itself."""
        if not self.parses_tools:
            return text
        self.raw = [text]
        parser = self.parser_cls(self.tokenizer, self.vreq.tools)
        _, content, _ = parser.parse(text, self.vreq, enable_auto_tools=True)
        return content or ""

    def calls(self) -> tuple[ToolCall, ...]:
        """The whole output's calls, read by a fresh parser (vLLM's non-streamed path); a call keeps the id
        its streamed pieces carried."""
        if not self.parses_tools:
            return ()
        parser = self.parser_cls(self.tokenizer, self.vreq.tools)
        _, _, found = parser.parse("".join(self.raw), self.vreq, enable_auto_tools=True)
        calls = enumerate(found or ())
        return tuple(ToolCall(self.ids.get(i) or f.id or call_id(), f.name, f.arguments) for i, f in calls)


def chat_call(request: StageRequest, model: str, parser_cls: Any, tokenizer: Any) -> ChatCall:
    """vLLM's request model for ``request``, adjusted by the engine's tool parser as ``vllm serve`` does.
    A request vLLM refuses (a bad schema, a choice naming no tool) is the caller's error."""
    from pydantic import ValidationError
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    fields = openai_fields(request)
    if request.tool_use is not None and request.tool_use.calls_possible and parser_cls is None:
        raise EngineRequestError(
            f"engine for {model} has no tool parser configured (tool_parser in the pool file), so it cannot"
            " return tool calls; send tool_choice none or pick another model"
        )
    try:
        vreq = ChatCompletionRequest(
            model=model,
            messages=openai_messages(request.messages),
            **fields,
            **sampling_fields(request.sampling),
        )
    except (ValidationError, ValueError) as e:
        raise EngineRequestError(f"vLLM refused the request: {e}") from None
    if parser_cls is not None and vreq.tools:
        vreq = parser_cls(tokenizer, vreq.tools).adjust_request(vreq)
    return ChatCall(vreq, parser_cls, tokenizer)


def chat_sampling(
    call: ChatCall, max_tokens: int, stream_tokens: int, defaults: Mapping[str, Any], stream: bool = True
) -> Any:
    """vLLM's SamplingParams of the call's request model, streaming deltas (not ``stream``: one output, the
    whole answer); an unset field takes the model's default from ``defaults``, as vllm serve does."""
    from vllm.sampling_params import RequestOutputKind

    params = call.vreq.to_sampling_params(max_tokens, dict(defaults))
    params.output_kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
    params.stream_interval = stream_tokens
    return params


def tool_parser_class(name: str, tokenizer: Any, model: str) -> Any:
    """The composed vLLM parser for tool parser ``name`` ("" for none), checked against the tokenizer."""
    if not name:
        return None
    from vllm.parser.parser_manager import ParserManager

    return ParserManager.get_parser(
        tool_parser_name=name, enable_auto_tools=True, model_name=model, tokenizer=tokenizer
    )
