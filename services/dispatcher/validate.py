"""Input checks of the front door: everything cheap is refused before anything is written to Redis.

Every check is a pure function of the request (and, for stage jumps, the program's row) and raises one of
two errors: ``InvalidRequest`` (INVALID_ARGUMENT / HTTP 400) for a malformed field, ``RequestTooLarge``
(RESOURCE_EXHAUSTED / HTTP 413) for an amount of data over a limit. Nothing else may escape: an input the
checks let through must not fail later as INTERNAL.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from services.common.chat import ResponseFormat, ToolUse
from services.common.keys import ProgramField
from services.common.types import ROLES, ChatMessage, SamplingParams, StageRequest
from services.dispatcher.errors import InvalidRequest, RequestTooLarge

# Defaults of the limits, shared with the settings (``config.py``) so that tests building ``Limits`` by hand
# get production values for the limits they do not name.
MAX_MESSAGES = 1000
MAX_STOP_SEQUENCES = 16
MAX_STOP_CHARS = 256
MAX_WORKFLOW_CHARS = 200
MAX_ID_CHARS = 200
MAX_STAGE = 10_000
MAX_STAGE_SKIP = 4
# OpenAI's own bounds: at most 128 tools per request, function names of 1-64 letters, digits, _ and -.
MAX_TOOLS = 128
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Not a knob: longer than any served model name (a Hugging Face repo id is at most 96 characters).
MAX_MODEL_CHARS = 256
# A wire bound, not a knob: gRPC's timeout_ms is a uint32, and the HTTP header gets the same range.
MAX_TIMEOUT_MS = 2**32 - 1

# Ids become parts of Redis key names (``chimera:prog:<id>``, ``chimera:{e}:req:<id>``) and log lines: no
# whitespace, no hash-tag braces (a ``{`` would move a key to another Cluster slot), no glob characters
# (``*?[]`` would widen a SCAN pattern), no quotes or backslashes.
ID_PATTERN = r"[A-Za-z0-9._:/@+=-]+"  # also documented in /openapi.json (http_doc.py)
_ID = re.compile(ID_PATTERN)
_ID_CHARS = "letters, digits and . _ : / @ + = -"
# The dispatcher puts a tenant's name and "~" in front of its ids (tenancy.py); a client's own id never
# holds "~", and the limits apply to the client's part.
_TENANT_PREFIX = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}~")
# Workflow names are predictor features, metric labels and report keys: a plain path-like name.
WORKFLOW_PATTERN = r"[A-Za-z0-9._:/-]+"
_WORKFLOW = re.compile(WORKFLOW_PATTERN)
_WORKFLOW_CHARS = "letters, digits and . _ : / -"
# A lone UTF-16 surrogate (JSON "\ud800") is a str Python holds but cannot encode as UTF-8: Redis, gRPC
# and the engines would all fail on it later.
_SURROGATE = re.compile(r"[\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class Limits:
    max_tokens_limit: int
    max_prompt_chars: int  # messages and stop sequences together
    max_messages: int = MAX_MESSAGES
    max_stop_sequences: int = MAX_STOP_SEQUENCES
    max_stop_chars: int = MAX_STOP_CHARS  # each stop sequence
    max_workflow_chars: int = MAX_WORKFLOW_CHARS
    max_id_chars: int = MAX_ID_CHARS
    max_stage: int = MAX_STAGE
    max_stage_skip: int = MAX_STAGE_SKIP


def check_id(kind: str, value: str, max_chars: int = MAX_ID_CHARS) -> None:
    prefix = _TENANT_PREFIX.match(value)
    value = value[prefix.end() :] if prefix else value
    if not value:
        raise InvalidRequest(f"{kind} is required")
    if len(value) > max_chars:
        raise InvalidRequest(f"{kind} has {len(value)} characters; the limit is {max_chars}")
    if not _ID.fullmatch(value):
        raise InvalidRequest(f"{kind} may hold only {_ID_CHARS}")


def check_text(field: str, value: str) -> None:
    if _SURROGATE.search(value):
        raise InvalidRequest(f"{field} holds a lone UTF-16 surrogate; text must be valid Unicode")


def check_workflow(workflow: str, max_chars: int) -> None:
    if not workflow.strip():
        raise InvalidRequest("workflow is required")
    if len(workflow) > max_chars:
        raise InvalidRequest(f"workflow has {len(workflow)} characters; the limit is {max_chars}")
    if not _WORKFLOW.fullmatch(workflow):
        raise InvalidRequest(f"workflow may hold only {_WORKFLOW_CHARS}")


def check_stage(stage: int, max_stage: int) -> None:
    if not 0 <= stage <= max_stage:
        raise InvalidRequest(f"stage must be in [0, {max_stage}], got {stage}")


def check_timeout_ms(timeout_ms: int) -> None:
    if not 0 <= timeout_ms <= MAX_TIMEOUT_MS:
        raise InvalidRequest(f"timeout_ms must be in [0, {MAX_TIMEOUT_MS}], got {timeout_ms}")


def check_stage_skip(stage: int, program: Mapping[str, str], max_skip: int) -> None:
    """A stage may run ahead of the stage expected next (the program's last + 1; 0 for a program the table
    does not hold) by at most ``max_skip``. A skip is allowed at all because the table is not the source of
    truth: a row expires after ``program_ttl_s`` idle, and frameworks that number graph nodes skip the
    branches not taken. Going backwards is the ASSIGN script's to refuse (it sees the row atomically)."""
    last = program.get(ProgramField.STAGE)
    expected = 0 if last is None else int(last) + 1
    if stage > expected + max_skip:
        whose = "a new program" if last is None else f"program's last stage {last}"
        raise InvalidRequest(
            f"stage {stage} skips ahead of {whose}: at most stage {expected + max_skip} "
            f"(max_stage_skip={max_skip})"
        )


def check_stop(stop: Iterable[str], limits: Limits) -> None:
    stop = tuple(stop)
    if len(stop) > limits.max_stop_sequences:
        raise InvalidRequest(f"stop has {len(stop)} sequences; the limit is {limits.max_stop_sequences}")
    for i, s in enumerate(stop):
        if not s:
            raise InvalidRequest(f"stop[{i}] is empty: it would match before the first token")
        if len(s) > limits.max_stop_chars:
            raise InvalidRequest(f"stop[{i}] has {len(s)} characters; the limit is {limits.max_stop_chars}")
        check_text(f"stop[{i}]", s)


def check_model(model: str) -> None:
    if len(model) > MAX_MODEL_CHARS:
        raise InvalidRequest(f"model has {len(model)} characters; the limit is {MAX_MODEL_CHARS}")
    check_text("model", model)


def _json_object(field: str, text: str) -> None:
    """``text`` must be a JSON object (a schema, a call's arguments): an engine fails on anything else."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise InvalidRequest(f"{field} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"{field} must be a JSON object")


def check_history(messages: tuple[ChatMessage, ...]) -> None:
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise InvalidRequest(f"messages[{i}].role {m.role!r} is not one of {sorted(ROLES)}")
        if m.role == "tool" and not m.tool_call_id:
            raise InvalidRequest(f"messages[{i}].tool_call_id is required in a message of role tool")
        if m.tool_calls and m.role != "assistant":
            raise InvalidRequest(f"messages[{i}].tool_calls: only an assistant message makes tool calls")
        for j, call in enumerate(m.tool_calls):
            if not _FUNCTION_NAME.fullmatch(call.name):
                raise InvalidRequest(f"messages[{i}].tool_calls[{j}].function.name {call.name!r} is invalid")
            _json_object(f"messages[{i}].tool_calls[{j}].function.arguments", call.arguments or "{}")


def check_tool_use(use: ToolUse) -> None:
    if len(use.tools) > MAX_TOOLS:
        raise InvalidRequest(f"tools has {len(use.tools)} entries; the limit is {MAX_TOOLS}")
    names = [t.name for t in use.tools]
    for i, t in enumerate(use.tools):
        if not _FUNCTION_NAME.fullmatch(t.name):
            raise InvalidRequest(f"tools[{i}].function.name must be 1-64 letters, digits, _ or -")
        if t.parameters:
            _json_object(f"tools[{i}].function.parameters", t.parameters)
    if len(set(names)) != len(names):
        raise InvalidRequest("tools: function names must be unique")
    if use.choice in ("required", "function") and not use.tools:
        raise InvalidRequest(f"tool_choice {use.choice!r} needs tools")
    if use.choice == "function" and use.function not in names:
        raise InvalidRequest(f"tool_choice names function {use.function!r}, which is not in tools")


def check_response_format(fmt: ResponseFormat) -> None:
    if fmt.type == "json_schema":
        _json_object("response_format.json_schema.schema", fmt.schema or "{}")


def _within(value: float | None, low: float, high: float, low_open: bool = False) -> bool:
    """None (the model's default) or a finite number in [low, high] ((low, high] when ``low_open``)."""
    if value is None:
        return True
    return math.isfinite(value) and (low < value if low_open else low <= value) and value <= high


def check_sampling(s: SamplingParams) -> None:
    if not _within(s.temperature, 0.0, 2.0):
        raise InvalidRequest("temperature must be in [0, 2]")
    if not _within(s.top_p, 0.0, 1.0, low_open=True):
        raise InvalidRequest("top_p must be in (0, 1]")
    if s.seed is not None and not 0 <= s.seed < 2**64:
        raise InvalidRequest("seed must be in [0, 2**64)")
    if s.top_k is not None and s.top_k < -1:
        raise InvalidRequest("top_k must be -1, 0 (both off) or a positive count")
    if not _within(s.min_p, 0.0, 1.0):
        raise InvalidRequest("min_p must be in [0, 1]")
    for name in ("presence_penalty", "frequency_penalty"):
        if not _within(getattr(s, name), -2.0, 2.0):
            raise InvalidRequest(f"{name} must be in [-2, 2]")
    if not _within(s.repetition_penalty, 0.0, 2.0, low_open=True):
        raise InvalidRequest("repetition_penalty must be in (0, 2]")


def _size(req: StageRequest) -> int:
    """Characters the engine gets: messages, the calls in them, stop sequences, tool schemas, the format."""
    size = sum(len(m.content) for m in req.messages)
    size += sum(len(c.arguments) + len(c.name) for m in req.messages for c in m.tool_calls)
    size += sum(len(x) for x in req.sampling.stop)
    if req.tool_use is not None:
        size += sum(len(t.name) + len(t.description) + len(t.parameters) for t in req.tool_use.tools)
    if req.response_format is not None:
        size += len(req.response_format.schema)
    return size


def validate_request(req: StageRequest, limits: Limits) -> None:
    """Raise ``InvalidRequest`` or ``RequestTooLarge`` for a request no engine should see."""
    check_id("program_id", req.program_id, limits.max_id_chars)
    check_id("request_id", req.request_id, limits.max_id_chars)
    check_workflow(req.workflow, limits.max_workflow_chars)
    check_stage(req.stage, limits.max_stage)
    if not req.messages:
        raise InvalidRequest("messages must not be empty")
    if len(req.messages) > limits.max_messages:
        raise RequestTooLarge(f"messages has {len(req.messages)} entries; the limit is {limits.max_messages}")
    check_history(req.messages)
    s = req.sampling
    check_stop(s.stop, limits)
    # Stop sequences and tool schemas travel with the prompt to the engine, so they count towards its size.
    size = _size(req)
    if size > limits.max_prompt_chars:
        raise RequestTooLarge(
            f"prompt (messages, stop and tools) has {size} characters; the limit is {limits.max_prompt_chars}"
        )
    for i, m in enumerate(req.messages):
        check_text(f"messages[{i}].content", m.content)
    if req.tool_use is not None:
        check_tool_use(req.tool_use)
        for i, t in enumerate(req.tool_use.tools):
            check_text(f"tools[{i}]", t.description + t.parameters)
    if req.response_format is not None:
        check_response_format(req.response_format)
    if not any(m.role == "user" and m.content.strip() for m in req.messages):
        raise InvalidRequest("messages need at least one non-empty user message (the task text)")
    if req.model_pin is not None:
        check_model(req.model_pin)
    if not 1 <= s.max_tokens <= limits.max_tokens_limit:
        raise InvalidRequest(f"max_tokens must be in [1, {limits.max_tokens_limit}], got {s.max_tokens}")
    check_sampling(s)
