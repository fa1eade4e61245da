"""What ``QueueStore`` takes and returns, and the output events its scripts write (JSON objects in field
``ev`` of a request's stream: ``{"t": "delta", "a": attempt, "text": ...}``, then exactly one
``{"t": "final", ...}`` or ``{"t": "error", "code": ..., "message": ...}``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from redis.typing import EncodableT, KeyT

from services.common.keys import Keys
from services.common.types import ClaimedRequest, Prediction, StageResult

READ_BATCH = 512  # output events one read returns at most


class EngineFull(Exception):
    """The engine holds more in-flight work than the request's admission bound allowed."""


@dataclass(frozen=True, slots=True)
class Retention:
    # How long a request may wait for an engine; it never expires while it runs (leases and the reaper
    # look after a dead worker's requests), and an output stream lives this long after its last event.
    queue_ttl_s: int = 3600
    finished_ttl_s: int = 300  # how long a finished request and its output stream stay readable
    stream_maxlen: int = 10_000  # output events kept per request (deltas are coalesced by the worker)
    notify_maxlen: int = 20_000  # event copies kept per engine (a reader further behind polls instead)
    traces_maxlen: int = 200_000  # trace rows kept per engine
    # Distinct worker deaths a request may be running in before it is failed as poison (queue_scripts'
    # GIVE_BACK). Only the default: an engine's worker registers its own setting in the engine's info hash,
    # which every reaper of that engine (the dispatcher's too) reads first.
    max_attempts: int = 3


@dataclass(frozen=True, slots=True)
class RenewResult:
    lost: frozenset[str]  # leases the worker no longer holds: stop working on these
    cancelled: frozenset[str]  # cancellation requested: abort these and complete them as cancelled


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """What a retry of a request needs to re-attach to it: whose it is and how it was scheduled."""

    program_id: str
    prediction: Prediction
    score: float
    enqueued_unix: float
    state: str


@dataclass(frozen=True, slots=True)
class OutputEvent:
    stream_id: str
    data: dict[str, Any]


def event_json(**kw: Any) -> str:
    return json.dumps(kw, separators=(",", ":"))


def poison_message(engine: str) -> str:
    # The script appends how many workers died running it and their ids.
    return f"poison request: engine {engine} failed under it on every attempt"


def cancelled_event(reason: str) -> str:
    # What CANCEL answers a queued request with: a cancelled request whose worker died ends the same way.
    return event_json(
        t="final",
        a=0,
        text="",
        finish_reason="cancelled",
        prompt_tokens=0,
        completion_tokens=0,
        reason=reason,
    )


def give_back_keys(k: Keys, engine: str) -> list[KeyT]:
    """The keys REAP and RETURN_CLAIMS share (queue_scripts' GIVE_BACK)."""
    return [k.claims(engine), k.queue(engine), k.inflight(engine), k.engine_info(engine), k.notify(engine)]


def give_back_args(k: Keys, r: Retention, engine: str, cancelled_reason: str, now: float) -> list[EncodableT]:
    """The arguments REAP and RETURN_CLAIMS share (queue_scripts' GIVE_BACK configuration)."""
    return [
        k.request(engine, ""),
        k.output(engine, ""),
        r.max_attempts,
        r.finished_ttl_s,
        poison_message(engine),
        repr(now),
        r.notify_maxlen,
        r.queue_ttl_s,
        cancelled_event(cancelled_reason),
    ]


def paused_tokens(c: ClaimedRequest, result: StageResult) -> int:
    """What a finished stage's tool pause keeps in its engine's load (``pause_scripts``): the program's
    predicted remaining tokens less this stage's output, when the stage ended in tool calls of a program that
    goes on (not its last stage) and the dispatcher gave it a pause deadline; else 0."""
    req = c.request
    if result.finish_reason != "tool_calls" or req.last_stage or req.pause_ttl_s <= 0:
        return 0
    return max(0, c.predicted - max(0, result.completion_tokens))
