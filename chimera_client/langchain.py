"""``ChimeraChatModel``: a LangChain chat model served by Chimera's gRPC front door.

Inside a run made current by ``chimera_client.langgraph.instrument`` (or ``program.active``) every call is
the run's next stage; outside one, a call is a one-stage program that is ended as soon as it returns.
Streaming goes through the SDK's stream (each token as LangChain's ``on_llm_new_token``), and each
stage's model, engine and queue wait are on the message (``response_metadata["chimera"]``) and in the
run's ``stages``.

Tools: ``bind_tools`` passes LangChain tools (any form ``convert_to_openai_tool`` takes) and the tool choice
to the engine, whose vLLM tool parser returns calls as ``AIMessage.tool_calls``; ``ToolMessage`` results go
back as tool turns, so a ``ToolNode`` graph (LangGraph's ``create_react_agent``) runs through Chimera.
``with_structured_output`` is LangChain's own, on top of ``bind_tools``.

Needs ``langchain-core`` (the ``langgraph`` extra).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from chimera_client.client import DEFAULT_ADDR, AsyncClient, Client
from chimera_client.errors import ChimeraError
from chimera_client.program import ProgramRun, StageRecord, current_run
from chimera_client.types import Completion, Message, Sampling, TextDelta, Tool, ToolCall, Tools

DEFAULT_WORKFLOW = "default"
_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}
# LangChain's names for "some tool must be called" (OpenAI's "required").
_REQUIRED = ("any", "required", True)


def _message(m: BaseMessage) -> Message:
    if isinstance(m, ToolMessage):
        return Message("tool", str(m.text), tool_call_id=m.tool_call_id)
    calls = tuple(
        ToolCall(c.get("id") or "", c["name"], json.dumps(c["args"])) for c in getattr(m, "tool_calls", ())
    )
    return Message(_ROLES.get(m.type, "user"), str(m.text), calls)


def to_chimera(messages: Sequence[BaseMessage]) -> tuple[Message, ...]:
    """LangChain messages as chat turns, tool calls and tool results included."""
    return tuple(_message(m) for m in messages)


def to_tools(tools: Sequence[Any], tool_choice: Any = None) -> Tools:
    """LangChain tools (functions, pydantic models, ``BaseTool``s, OpenAI dicts) and choice, as the SDK's."""
    functions = [Tool.from_openai(convert_to_openai_tool(t)["function"]) for t in tools]
    if tool_choice in (None, "auto"):
        choice = "auto"
    elif tool_choice in _REQUIRED:
        choice = "required"
    elif isinstance(tool_choice, dict):
        choice = tool_choice["function"]["name"]
    else:
        choice = str(tool_choice)  # "none", or a tool's name
    return Tools(tuple(functions), choice)


def _lc_calls(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    return [
        {"name": c.name, "args": json.loads(c.arguments or "{}"), "id": c.id, "type": "tool_call"}
        for c in calls
    ]


def chimera_metadata(c: Completion, stage: int) -> dict[str, Any]:
    return {
        "program_stage": stage,
        "model": c.model,
        "engine": c.engine,
        "queue_wait_s": c.queue_wait_s,
        "request_id": c.request_id,
        "attempts": c.attempts,
    }


def _final_fields(c: Completion, stage: int) -> dict[str, Any]:
    """What the last message (or chunk) of a stage carries besides its text."""
    return {
        "response_metadata": {
            "model_name": c.model,
            "finish_reason": c.finish_reason,
            "chimera": chimera_metadata(c, stage),
        },
        "usage_metadata": {
            "input_tokens": c.prompt_tokens,
            "output_tokens": c.completion_tokens,
            "total_tokens": c.prompt_tokens + c.completion_tokens,
        },
    }


class _Fold:
    """Turns one stage's SDK events into LangChain chunks. Only the first attempt's text is streamed:
    a request re-run after its worker died samples the same text again (its seed comes from its id), so
    what the final answer adds past the streamed text is sent at the end, and a re-run that diverged
    fails the call rather than leaving the caller with text the final answer does not have."""

    def __init__(self, run: ProgramRun, stage: int) -> None:
        self.run, self.stage = run, stage
        self.sent = ""
        self.attempt: int | None = None

    def chunk(self, ev: TextDelta | Completion) -> ChatGenerationChunk | None:
        if isinstance(ev, TextDelta):
            self.attempt = ev.attempt if self.attempt is None else self.attempt
            if ev.attempt != self.attempt or not ev.text:
                return None
            self.sent += ev.text
            return ChatGenerationChunk(message=AIMessageChunk(content=ev.text))
        if not ev.text.startswith(self.sent):
            raise ChimeraError("ABORTED", f"request {ev.request_id} was re-run and its streamed text changed")
        self.run.record(StageRecord.of(ev, self.stage))
        rest = ev.text[len(self.sent) :]
        # The calls come whole with the final chunk: LangChain merges chunks by index, and the whole call is
        # what the answer says (a streamed piece of a re-run could differ).
        chunks = [
            {"name": c.name, "args": c.arguments, "id": c.id, "index": i, "type": "tool_call_chunk"}
            for i, c in enumerate(ev.tool_calls)
        ]
        message = AIMessageChunk(content=rest, tool_call_chunks=chunks, **_final_fields(ev, self.stage))
        return ChatGenerationChunk(message=message)


def _result(c: Completion, stage: int) -> ChatResult:
    message = AIMessage(c.text, tool_calls=_lc_calls(c.tool_calls), **_final_fields(c, stage))
    return ChatResult(generations=[ChatGeneration(message=message)])


class ChimeraChatModel(BaseChatModel):
    """``ChimeraChatModel(addr="127.0.0.1:50051")``: each call is one stage of the current run."""

    addr: str = DEFAULT_ADDR
    api_key: str | None = None  # default: CHIMERA_API_KEY
    model: str = "auto"  # or a model name to pin
    max_tokens: int = 0  # 0: the dispatcher's default
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    timeout_s: float | None = None

    @property
    def _llm_type(self) -> str:
        return "chimera"

    def _sampling(self, stop: list[str] | None) -> Sampling:
        return Sampling(self.max_tokens, self.temperature, self.top_p, self.seed, tuple(stop or ()))

    def _stage(self) -> tuple[ProgramRun, int, bool]:
        """(run, stage, whether this call owns its one-stage program)."""
        run = current_run()
        if run is not None:
            return run, run.next_stage(), False
        run = ProgramRun(DEFAULT_WORKFLOW)
        return run, run.next_stage(), True

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """This model with ``tools`` offered on every call (``tool_choice``: "auto", "none", "any" or
        "required", or a tool's name)."""
        return self.bind(chimera_tools=to_tools(tools, tool_choice), **kwargs)

    def _args(
        self, run: ProgramRun, stage: int, stop: list[str] | None, kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "program_id": run.program_id,
            "stage": stage,
            "workflow": run.workflow,
            "model": self.model,
            "sampling": self._sampling(stop),
            "timeout_s": self.timeout_s,
            "tools": kwargs.get("chimera_tools"),
        }

    # A channel per call: LangChain may call a model from any thread or event loop, and a gRPC aio
    # channel belongs to one loop; a local connection costs a millisecond or two, a stage far more.

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        run, stage, own = self._stage()
        with Client(self.addr, api_key=self.api_key) as client:
            try:
                c = client.generate(to_chimera(messages), **self._args(run, stage, stop, kwargs))
            finally:
                if own:
                    client.end_program(run.program_id)
        run.record(StageRecord.of(c, stage))
        return _result(c, stage)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        run, stage, own = self._stage()
        async with AsyncClient(self.addr, api_key=self.api_key) as client:
            try:
                c = await client.generate(to_chimera(messages), **self._args(run, stage, stop, kwargs))
            finally:
                if own:
                    await client.end_program(run.program_id)
        run.record(StageRecord.of(c, stage))
        return _result(c, stage)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        run, stage, own = self._stage()
        fold = _Fold(run, stage)
        with Client(self.addr, api_key=self.api_key) as client:
            try:
                for ev in client.stream(to_chimera(messages), **self._args(run, stage, stop, kwargs)):
                    if (chunk := fold.chunk(ev)) is not None:
                        if run_manager is not None and chunk.text:
                            run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                        yield chunk
            finally:
                if own:
                    client.end_program(run.program_id)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        run, stage, own = self._stage()
        fold = _Fold(run, stage)
        async with AsyncClient(self.addr, api_key=self.api_key) as client:
            try:
                async for ev in client.stream(to_chimera(messages), **self._args(run, stage, stop, kwargs)):
                    if (chunk := fold.chunk(ev)) is not None:
                        if run_manager is not None and chunk.text:
                            await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                        yield chunk
            finally:
                if own:
                    await client.end_program(run.program_id)
