"""Property: whatever a door hands the intake, the pure checks either accept it or raise one of the two
documented errors (InvalidRequest, RequestTooLarge), never anything else; and what they accept is safe to
write to Redis (ids are key-safe, text encodes as UTF-8, the deadline is a finite time)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.keys import ProgramField
from services.common.types import ChatMessage, SamplingParams, StageRequest
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.errors import InvalidRequest, RequestTooLarge
from services.dispatcher.intake import Intake, admit
from services.dispatcher.validate import validate_request

pytestmark = pytest.mark.unit

SETTINGS = DispatcherSettings(
    max_tokens_limit=512, max_prompt_chars=300, max_messages=6, max_stop_sequences=3, max_stop_chars=8
)
LIMITS = SETTINGS.limits()
DOCUMENTED = (InvalidRequest, RequestTooLarge)

# Every code point, lone surrogates included (hypothesis leaves them out of text() by default).
any_char = st.characters(codec=None, categories=None)
text = st.one_of(st.text(any_char, max_size=40), st.sampled_from(["", " ", "w", "code/coder", "{x}", "a b"]))
ident = st.one_of(text, st.text("abc-_.:{}*? ", min_size=1, max_size=12), st.just("r" * 201))
big_int = st.one_of(st.integers(-5, 12), st.integers(-(2**70), 2**70))
floats = st.floats(allow_nan=True, allow_infinity=True)
role = st.sampled_from(["system", "user", "assistant", "tool", "wizard", ""])
messages = st.lists(st.builds(ChatMessage, role, text), max_size=8).map(tuple)
stops = st.lists(text, max_size=5).map(tuple)
program = st.one_of(st.just({}), st.builds(lambda s: {ProgramField.STAGE: str(s)}, st.integers(0, 20)))


@settings(max_examples=400, deadline=None)
@given(
    program_id=ident,
    stage=st.one_of(st.none(), big_int),
    workflow=text,
    messages=messages,
    max_tokens=st.one_of(st.none(), big_int),
    temperature=floats,
    top_p=floats,
    seed=st.one_of(st.none(), st.integers(0, 2**64 - 1)),
    stop=stops,
    model=text,
    request_id=st.one_of(st.just(""), ident),
    timeout_ms=st.one_of(st.integers(0, 10_000), big_int),
    row=program,
)
def test_an_intake_is_admitted_or_refused_as_documented(
    program_id: str,
    stage: int | None,
    workflow: str,
    messages: tuple[ChatMessage, ...],
    max_tokens: int | None,
    temperature: float,
    top_p: float,
    seed: int | None,
    stop: tuple[str, ...],
    model: str,
    request_id: str,
    timeout_ms: int,
    row: dict[str, str],
) -> None:
    intake = Intake(
        program_id,
        stage,
        workflow,
        messages,
        SamplingParams(max_tokens or 0, temperature=temperature, top_p=top_p, seed=seed, stop=stop),
        model,
        request_id,
        timeout_ms,
    )
    try:
        req = admit(intake, row, SETTINGS, LIMITS, now=1_700_000_000.0)
    except DOCUMENTED:
        return
    for s in (req.program_id, req.request_id, req.workflow, *req.sampling.stop, req.model_pin or ""):
        s.encode()
    for m in req.messages:
        m.content.encode()
    assert not any(c in req.program_id + req.request_id for c in "{}*?[] \t\n")
    assert 0 <= req.stage <= LIMITS.max_stage
    assert req.deadline_unix is None or math.isfinite(req.deadline_unix)


@settings(max_examples=300, deadline=None)
@given(
    request_id=ident,
    program_id=ident,
    stage=big_int,
    workflow=text,
    messages=messages,
    max_tokens=big_int,
    temperature=floats,
    top_p=floats,
    stop=stops,
)
def test_a_stage_request_passes_or_raises_a_documented_error(
    request_id: str,
    program_id: str,
    stage: int,
    workflow: str,
    messages: tuple[ChatMessage, ...],
    max_tokens: int,
    temperature: float,
    top_p: float,
    stop: tuple[str, ...],
) -> None:
    req = StageRequest(
        request_id,
        program_id,
        stage,
        workflow,
        messages,
        SamplingParams(max_tokens, temperature, top_p, stop=stop),
    )
    try:
        validate_request(req, LIMITS)
    except DOCUMENTED:
        pass
