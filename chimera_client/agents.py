"""OpenAI Agents SDK: an agent run, handoffs and all, as one Chimera program.

    async with ChimeraModelProvider("code/planner-coder-reviewer", addr="127.0.0.1:50051") as chimera:
        result = await Runner.run(planner, task, run_config=chimera.run_config())
        chimera.set_outcome(1.0)                  # optional; EndProgram carries it at the block's end

A provider is one run: every model call the run makes, whichever agent makes it, is the program's next
stage, over the gRPC SDK (streamed for ``Runner.run_streamed``). The answer goes back in the SDK's own
formats through its own converters (chat completion -> Responses items and stream events), so the Runner
sees what it would see from an OpenAI chat-completions model.

Tools, handoffs and an ``output_type`` go to the engine as OpenAI tools and a ``json_schema`` format, through
the SDK's own converters; the engine's vLLM tool parser answers with real calls (their arguments the
model's), which the Runner executes; the history, tool calls and results included, goes back as chat turns.
The model settings (tool_choice, parallel_tool_calls, temperature, top_p, max_tokens, the penalties) are
passed on.

Needs ``openai-agents`` (the ``openai-agents`` extra).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from types import TracebackType
from typing import Any

from agents import Handoff, Model, ModelProvider, ModelResponse, ModelSettings, RunConfig, Tool, Usage
from agents.agent_output import AgentOutputSchemaBase
from agents.items import TResponseInputItem, TResponseStreamEvent
from agents.models.chatcmpl_converter import Converter
from agents.models.chatcmpl_stream_handler import ChatCmplStreamHandler
from agents.models.interface import ModelTracing
from openai import Omit
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessage, ChatCompletionMessageToolCall
from openai.types.chat.chat_completion_chunk import ChoiceDelta, ChoiceDeltaToolCall
from openai.types.completion_usage import CompletionUsage
from openai.types.responses import Response

from chimera_client.client import DEFAULT_ADDR, AsyncClient
from chimera_client.program import ProgramRun, StageRecord
from chimera_client.types import (
    Completion,
    Message,
    ProgramEnd,
    ResponseFormat,
    Sampling,
    TextDelta,
    ToolCall,
    Tools,
)
from chimera_client.types import Tool as ChimeraTool

__all__ = ["ChimeraModel", "ChimeraModelProvider"]


class ChimeraModelProvider(ModelProvider):
    """The models of one agent run, all stages of one program (see the module docstring)."""

    def __init__(
        self,
        workflow: str,
        *,
        addr: str = DEFAULT_ADDR,
        api_key: str | None = None,
        program_id: str | None = None,
        sampling: Sampling = Sampling(),
        timeout_s: float | None = None,
    ) -> None:
        self.run = ProgramRun(workflow, program_id)
        self.sampling = sampling
        self.timeout_s = timeout_s
        # One channel for the run: a run's model calls all happen on the loop that runs it.
        self.client = AsyncClient(addr, api_key=api_key)
        self.ended: ProgramEnd | None = None

    def get_model(self, model_name: str | None) -> Model:
        """``model_name``: a Chimera model to pin, or None / "auto" to let the router choose."""
        return ChimeraModel(self, model_name or "auto")

    def run_config(self, **options: Any) -> RunConfig:
        """A ``RunConfig`` whose models are this provider's (``options``: any other RunConfig field)."""
        return RunConfig(model_provider=self, workflow_name=self.run.workflow, **options)

    def set_outcome(self, outcome: float) -> None:
        self.run.set_outcome(outcome)

    async def end(self, outcome: float | None = None) -> ProgramEnd:
        """End the program (once), with ``outcome`` or the one set before; closes the channel."""
        if outcome is not None:
            self.set_outcome(outcome)
        if self.ended is None:
            try:
                self.ended = await self.client.end_program(self.run.program_id, self.run.outcome)
            finally:
                await self.client.close()
        return self.ended

    async def aclose(self) -> None:
        await self.end()

    async def __aenter__(self) -> ChimeraModelProvider:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.end()


def _tools(settings: ModelSettings, tools: list[Tool], handoffs: list[Handoff]) -> Tools | None:
    """The agent's tools and handoffs as OpenAI tools (the SDK's converters), with its tool choice."""
    specs = [Converter.tool_to_openai(t) for t in tools] + [
        Converter.convert_handoff_tool(h) for h in handoffs
    ]
    if not specs:
        return None
    functions = [ChimeraTool.from_openai(dict(spec["function"])) for spec in specs]
    choice: Any = Converter.convert_tool_choice(settings.tool_choice)
    if isinstance(choice, Omit):
        choice = "auto"
    elif isinstance(choice, dict):
        choice = choice["function"]["name"]
    return Tools(tuple(functions), str(choice), settings.parallel_tool_calls is not False)


def _format(output_schema: AgentOutputSchemaBase | None) -> ResponseFormat | None:
    fmt = Converter.convert_response_format(output_schema)
    if isinstance(fmt, Omit) or fmt.get("type") != "json_schema":
        return None
    spec = dict(fmt["json_schema"])  # type: ignore[typeddict-item]
    return ResponseFormat(
        "json_schema", spec.get("schema") or {}, spec.get("name", "final_output"), bool(spec.get("strict"))
    )


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))


def _turns(system: str | None, items: str | list[TResponseInputItem]) -> tuple[Message, ...]:
    """The run's history as chat turns (the SDK's own converter to chat-completion messages), its tool
    calls and tool results included."""
    turns = [Message("system", system)] if system else []
    for m in Converter.items_to_messages(items):
        msg: dict[str, Any] = dict(m)
        calls = tuple(
            ToolCall(c["id"], c["function"]["name"], c["function"].get("arguments") or "{}")
            for c in msg.get("tool_calls") or ()
            if "function" in c
        )
        role = "system" if msg["role"] == "developer" else str(msg["role"])
        turns.append(Message(role, _text(msg.get("content")), calls, str(msg.get("tool_call_id") or "")))
    return tuple(turns)


def _openai_calls(calls: tuple[ToolCall, ...]) -> list[ChatCompletionMessageToolCall] | None:
    return [
        ChatCompletionMessageToolCall.model_validate(
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        )
        for c in calls
    ] or None


class ChimeraModel(Model):
    """One model of a ``ChimeraModelProvider``; each call is the next stage of the provider's run."""

    def __init__(self, provider: ChimeraModelProvider, model: str) -> None:
        self.provider = provider
        self.model = model

    def _request(
        self,
        system: str | None,
        items: str | list[TResponseInputItem],
        settings: ModelSettings,
        tools: list[Tool],
        handoffs: list[Handoff],
        output_schema: AgentOutputSchemaBase | None,
    ) -> tuple[tuple[Message, ...], dict[str, Any]]:
        p = self.provider
        if p.ended is not None:
            raise RuntimeError(f"program {p.run.program_id} has ended: a ChimeraModelProvider is one run")
        stage = p.run.next_stage()
        given: dict[str, Any] = {
            "max_tokens": settings.max_tokens,
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "presence_penalty": settings.presence_penalty,
            "frequency_penalty": settings.frequency_penalty,
        }
        sampling = replace(p.sampling, **{k: v for k, v in given.items() if v is not None})
        args = {
            "program_id": p.run.program_id,
            "stage": stage,
            "workflow": p.run.workflow,
            "model": self.model,
            "sampling": sampling,
            "timeout_s": p.timeout_s,
            "tools": _tools(settings, tools, handoffs),
            "response_format": _format(output_schema),
        }
        return _turns(system, items), args

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any | None,
    ) -> ModelResponse:
        messages, args = self._request(
            system_instructions, input, model_settings, tools, handoffs, output_schema
        )
        c = await self.provider.client.generate(messages, **args)
        self.provider.run.record(StageRecord.of(c, args["stage"]))
        content = c.text or None if c.tool_calls else c.text
        message = ChatCompletionMessage(
            role="assistant", content=content, tool_calls=_openai_calls(c.tool_calls)
        )
        return ModelResponse(
            output=Converter.message_to_output_items(message),
            usage=Usage(
                requests=1,
                input_tokens=c.prompt_tokens,
                output_tokens=c.completion_tokens,
                total_tokens=c.prompt_tokens + c.completion_tokens,
            ),
            response_id=None,
            request_id=c.request_id,
        )

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        messages, args = self._request(
            system_instructions, input, model_settings, tools, handoffs, output_schema
        )
        response = Response(
            id=f"chimera-{uuid.uuid4().hex}",
            created_at=time.time(),
            model=self.model,
            object="response",
            output=[],
            tool_choice="auto",
            tools=[],
            parallel_tool_calls=False,
        )
        chunks = self._chunks(self.provider.client.stream(messages, **args), args["stage"])
        async for event in ChatCmplStreamHandler.handle_stream(response, chunks, model=self.model):  # type: ignore[arg-type]
            yield event

    async def _chunks(
        self, events: AsyncIterator[TextDelta | Completion], stage: int
    ) -> AsyncIterator[ChatCompletionChunk]:
        """The stage's SDK stream as chat-completion chunks, the shape the Agents SDK's stream handler
        turns into Responses events. Only the first attempt's text is streamed (see
        ``chimera_client.langchain._Fold``); what the final answer adds past it comes last, with its
        tool calls whole (the handler assembles calls by index)."""
        sent, attempt = "", None
        async for ev in events:
            if isinstance(ev, TextDelta):
                attempt = ev.attempt if attempt is None else attempt
                if ev.attempt == attempt and ev.text:
                    sent += ev.text
                    yield _chunk(ChoiceDelta(content=ev.text))
                continue
            self.provider.run.record(StageRecord.of(ev, stage))
            if len(ev.text) > len(sent) and ev.text.startswith(sent):
                yield _chunk(ChoiceDelta(content=ev.text[len(sent) :]))
            calls = [
                ChoiceDeltaToolCall.model_validate({"index": i, **call.model_dump()})
                for i, call in enumerate(_openai_calls(ev.tool_calls) or ())
            ] or None
            usage = CompletionUsage(
                prompt_tokens=ev.prompt_tokens,
                completion_tokens=ev.completion_tokens,
                total_tokens=ev.prompt_tokens + ev.completion_tokens,
            )
            finish = "tool_calls" if calls else ("length" if ev.finish_reason == "length" else "stop")
            yield _chunk(ChoiceDelta(tool_calls=calls), finish, usage)


def _chunk(
    delta: ChoiceDelta, finish: str | None = None, usage: CompletionUsage | None = None
) -> ChatCompletionChunk:
    choice = {"index": 0, "delta": delta.model_dump(exclude_none=True), "finish_reason": finish}
    return ChatCompletionChunk.model_validate(
        {
            "id": "chimera",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": "chimera",
            "choices": [choice],
            "usage": usage.model_dump() if usage else None,
        }
    )
