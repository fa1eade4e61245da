"""The interface every engine implements; the worker knows nothing else about an engine.

NOTE(engine): an engine runs continuous batching on its own; the worker decides *what* it gets and *when*
(only while ``running() < max_num_seqs + prefetch``), so that the schedule stays in the Redis queue and not
in the engine's own waiting list.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from services.common.chat import ToolCall, ToolCallPiece
from services.common.types import EngineProfile, StageRequest


@dataclass(frozen=True, slots=True)
class EngineOutput:
    """One step of one request: new text since the last output, and the totals once finished."""

    text_delta: str
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | "tool_calls" once finished
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Prompt tokens the engine's prefix cache held (vLLM's count): what a stage on the engine that ran its
    # program's earlier stages saves. 0 where the engine does not say.
    cached_tokens: int = 0
    # Tool-call pieces since the last output (they stream like text), and once finished every call whole.
    tool_pieces: tuple[ToolCallPiece, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()


class EngineRequestError(ValueError):
    """The engine refused this one request as invalid (e.g. longer than its context); the engine is fine.

    The worker answers it INVALID_ARGUMENT instead of INTERNAL: retrying it elsewhere would fail the same way.
    """


class EngineUnavailableError(RuntimeError):
    """The engine could not serve this one request (a transient failure that outlasted its retries); the
    worker answers it UNAVAILABLE, and the heartbeat's health probe decides whether the engine is dead."""


class EngineDeadError(RuntimeError):
    """The engine process is gone; the worker exits so that its claims are re-queued."""


class Engine(Protocol):
    model: str  # the model name the dispatcher routes by
    max_num_seqs: int  # sequences the engine runs at once
    calls_tools: bool  # it reads tool calls out of its answers, so it may serve a request that allows them

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def generate(self, request: StageRequest, key: str, priority: int) -> AsyncIterator[EngineOutput]:
        """Run one request. ``key`` is unique per attempt; ``priority`` (lower first) is passed to
        engines that have their own priority scheduler as a second line of defence."""
        ...

    async def abort(self, key: str) -> None: ...

    def running(self) -> int:
        """Requests admitted and not yet finished."""
        ...

    async def health(self) -> str | None:
        """Why the engine is dead (its process gone, its loop stopped, its server unreachable for good), or
        None while it can serve. Polled with every heartbeat, so idle death is seen too: cheap, bounded."""
        ...

    def profile(self) -> EngineProfile | None:
        """The engine's measured profile if it knows one (a simulated engine does by construction)."""
        ...
