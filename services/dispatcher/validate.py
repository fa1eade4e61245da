"""Input checks of the front door: everything cheap is refused before anything is written to Redis."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from services.common.types import ROLES, StageRequest
from services.dispatcher.errors import InvalidRequest, RequestTooLarge

# Ids become parts of Redis key names and log lines: keep them short and free of whitespace.
_ID = re.compile(r"^[\x21-\x7e]{1,200}$")


@dataclass(frozen=True, slots=True)
class Limits:
    max_tokens_limit: int
    max_prompt_chars: int


def check_id(kind: str, value: str) -> None:
    if not value:
        raise InvalidRequest(f"{kind} is required")
    if not _ID.match(value):
        raise InvalidRequest(f"{kind} must be 1-200 printable ASCII characters without spaces")


def validate_request(req: StageRequest, limits: Limits) -> None:
    """Raise ``InvalidRequest`` or ``RequestTooLarge`` for a request no engine should see."""
    check_id("program_id", req.program_id)
    check_id("request_id", req.request_id)
    if not req.workflow.strip():
        raise InvalidRequest("workflow is required")
    if req.stage < 0:
        raise InvalidRequest("stage must be >= 0")
    if not req.messages:
        raise InvalidRequest("messages must not be empty")
    for i, m in enumerate(req.messages):
        if m.role not in ROLES:
            raise InvalidRequest(f"messages[{i}].role {m.role!r} is not one of {sorted(ROLES)}")
    if not any(m.role == "user" and m.content.strip() for m in req.messages):
        raise InvalidRequest("messages need at least one non-empty user message (the task text)")
    s = req.sampling
    if not 1 <= s.max_tokens <= limits.max_tokens_limit:
        raise InvalidRequest(f"max_tokens must be in [1, {limits.max_tokens_limit}], got {s.max_tokens}")
    if not (math.isfinite(s.temperature) and 0.0 <= s.temperature <= 2.0):
        raise InvalidRequest("temperature must be in [0, 2]")
    if not (math.isfinite(s.top_p) and 0.0 < s.top_p <= 1.0):
        raise InvalidRequest("top_p must be in (0, 1]")
    size = sum(len(m.content) for m in req.messages)
    if size > limits.max_prompt_chars:
        raise RequestTooLarge(f"prompt has {size} characters; the limit is {limits.max_prompt_chars}")
