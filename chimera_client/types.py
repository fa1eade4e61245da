"""Frozen results and inputs of the SDK; protobuf never leaks out of ``chimera_client``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True, slots=True)
class Message:
    role: str
    content: str


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


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of streamed text. A higher ``attempt`` than seen before means the request was re-run after
    its worker died: discard the text of earlier attempts (``Completion.text`` is always the winner's)."""

    text: str
    attempt: int


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
    finish_reason: str  # "stop" | "length" | "cancelled"
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
