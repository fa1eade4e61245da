"""One intake for both front doors: what a door received becomes a ``StageRequest`` by one set of rules.

Each door converts its wire format (a ``GenerateRequest``; an OpenAI body and its headers) into an
``Intake`` and nothing else; the defaults (request id, max_tokens), the model pin, the deadline and the
received time are decided here, once.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final

from services.common.chat import ResponseFormat, ToolUse
from services.common.keys import ProgramField
from services.common.types import ChatMessage, SamplingParams, StageRequest
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.tool_results import loop_state
from services.dispatcher.validate import (
    Limits,
    check_id,
    check_stage,
    check_stage_skip,
    check_timeout_ms,
    validate_request,
)

# The model name that lets the policy choose (as does an empty one).
AUTO_MODEL = "auto"


class IdentitySource:
    """How a request's program was found (``http_input``'s NOTE(identity)); the decision record keeps it."""

    HEADER: Final = "header"  # X-Chimera-Program-Id (gRPC: its program_id)
    METADATA: Final = "metadata"  # the body's metadata.program_id
    SESSION: Final = "session"  # a session id an agent client sends
    CONTINUATION: Final = "continuation"  # the conversation of an earlier stage, continued
    NEW: Final = "new"  # none of these: a new program
    # Programs no client named, so none ends: they lapse after conversation_ttl_s.
    UNNAMED: Final = frozenset({SESSION, CONTINUATION, NEW})


def idle_ttl_s(source: str, settings: DispatcherSettings) -> int:
    """How long a program's row outlives its last stage: a program its client names lives until the client
    ends it (``program_ttl_s`` at most); one no client named, only as long as its continuation is awaited."""
    return settings.conversation_ttl_s if source in IdentitySource.UNNAMED else settings.program_ttl_s


@dataclass(frozen=True, slots=True)
class Intake:
    """One stage request as a front door received it, before any default is applied."""

    program_id: str
    stage: int | None  # None: the program's next stage (its last stage + 1, or 0 for a new program)
    workflow: str
    messages: tuple[ChatMessage, ...]
    # As the door read it: max_tokens 0 is the dispatcher's default, a seed of None one derived from the id.
    sampling: SamplingParams
    model: str = ""  # "" or "auto": the policy chooses; anything else pins the model
    request_id: str = ""  # "": a fresh id
    timeout_ms: int = 0  # 0: no deadline
    last_stage: bool = False  # the workflow ends with this stage (StageRequest.last_stage)
    tool_use: ToolUse | None = None
    response_format: ResponseFormat | None = None
    stream: bool = True  # its caller reads deltas (StageRequest.stream)
    identity: str = IdentitySource.HEADER  # how its program was found (IdentitySource)


def pinned(model: str) -> str | None:
    """The model a request pins, from what it names: None for "auto" (or nothing), Chimera's choice."""
    return None if model in ("", AUTO_MODEL) else model


def next_stage(program: Mapping[str, str]) -> int:
    """The stage after the program's last one; 0 for a program the table does not hold."""
    last = program.get(ProgramField.STAGE)
    return 0 if last is None else int(last) + 1


def request_seed(request_id: str) -> int:
    """The sampling seed of a request whose caller gave none, from its id: a re-run after a worker died
    (or a client's retry) samples the same text on the same engine, so the caller's stream can go on
    where it stopped instead of failing. Distinct ids get unrelated seeds, so the randomness a caller
    asked for with a temperature is still there across requests."""
    return int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=4).digest(), "big") >> 1


def stage_request(intake: Intake, stage: int, settings: DispatcherSettings, now: float) -> StageRequest:
    """The ``StageRequest`` both doors dispatch (validation is the dispatcher's, right after)."""
    model = intake.model.strip()
    request_id = intake.request_id or uuid.uuid4().hex
    s = intake.sampling
    return StageRequest(
        request_id=request_id,
        program_id=intake.program_id,
        stage=stage,
        workflow=intake.workflow,
        messages=intake.messages,
        sampling=replace(
            s,
            max_tokens=s.max_tokens or settings.max_tokens_default,
            to_context=s.to_context and not s.max_tokens,
            seed=s.seed if s.seed is not None else request_seed(request_id),
        ),
        model_pin=pinned(model),
        deadline_unix=now + intake.timeout_ms / 1000.0 if intake.timeout_ms else None,
        received_unix=now,
        last_stage=intake.last_stage,
        tool_use=intake.tool_use,
        response_format=intake.response_format,
        stream=intake.stream,
        identity=intake.identity,
    )


def check_intake(intake: Intake, limits: Limits) -> None:
    """What must hold before the program row is read and the request built: the id is a key name, and the
    deadline is computed from the timeout."""
    check_id("program_id", intake.program_id, limits.max_id_chars)
    check_timeout_ms(intake.timeout_ms)
    if intake.stage is not None:
        check_stage(intake.stage, limits.max_stage)


def admit(
    intake: Intake, program: Mapping[str, str], settings: DispatcherSettings, limits: Limits, now: float
) -> StageRequest:
    """The validated ``StageRequest`` of an intake, given its program's row (empty: a new program). Pure;
    raises ``InvalidRequest`` or ``RequestTooLarge`` and nothing else."""
    check_intake(intake, limits)
    stage = next_stage(program) if intake.stage is None else intake.stage
    req = stage_request(intake, stage, settings, now)
    validate_request(req, limits)
    check_stage_skip(req.stage, program, limits.max_stage_skip)
    return replace(req, loop=loop_state(req, program), pause_ttl_s=idle_ttl_s(req.identity, settings))
