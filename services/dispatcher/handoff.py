"""What the dispatcher hands between its parts: a dispatched request, the items of its output stream, and
the observer told how that stream ended.

These types live apart from the code that makes them so that dispatch, streaming and metrics can each
import them without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from services.common.chat import ToolCall, ToolCallPiece
from services.common.types import DispatchTimings, Prediction, StageRequest


class RequestObserver(Protocol):
    """Told exactly once how a dispatched request's output stream ended (metrics)."""

    def finished(self, d: Dispatched, final: Final) -> None: ...

    def failed_with(self, d: Dispatched, code: str) -> None: ...

    def abandoned(self, d: Dispatched) -> None: ...


@dataclass(frozen=True, slots=True)
class Dispatched:
    """A request that is now waiting in an engine's queue."""

    request: StageRequest
    engine: str
    model: str
    prediction: Prediction
    score: float
    enqueued_unix: float
    dispatch_ms: float  # router + predictor + policy + Redis, as the caller's Completion reports it
    degraded: tuple[str, ...]  # dependencies that failed and were replaced by a fallback
    branch: str = "new"  # new | pinned | reuse | reuse-race
    observer: RequestObserver | None = None  # told how the request's stream ends
    timings: DispatchTimings = DispatchTimings()  # the split of dispatch_ms
    browned_out_from: str = ""  # the engine the policy chose, when its queue was full and this one took it


@dataclass(frozen=True, slots=True)
class Delta:
    text: str
    attempt: int
    tool_calls: tuple[ToolCallPiece, ...] = ()


@dataclass(frozen=True, slots=True)
class Final:
    request_id: str
    text: str
    finish_reason: str
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
    timings: DispatchTimings = DispatchTimings()
    browned_out_from: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    cached_prompt_tokens: int = 0  # of prompt_tokens, those the engine's prefix cache held


StreamItem = Delta | Final


@dataclass(frozen=True, slots=True)
class ProgramEnd:
    found: bool
    cancelled_requests: int
