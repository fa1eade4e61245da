"""What a stage's history says about its last tool run: whether it failed, how long the history is, and
where an open agent loop stands (``loop_state``, what the predictor of open loops reads).

OpenAI's tool messages carry no status, only text, so a failure is read from the text the way a developer
reads a test or build log: a Python traceback, a line that starts with FAILED / FAIL / ERROR, an exception
name with its message (``AssertionError: ...``), a non-zero exit code, or a JSON object whose first key is
``"error"``. Only the tool results after the last assistant turn count (the ones this stage answers).

The patterns are deliberately narrow, as a false failure can move a program off its warm engine (see
``services.policy.escalation``): a search result that merely contains the word "error" is not a failure.
A tool whose failures look different can say so in its first line (``FAILED: ...``). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from services.common.keys import ProgramField
from services.common.tokens import approx_tokens
from services.common.types import ChatMessage, LoopState, StageRequest

# Identities of programs a client named (services.dispatcher.intake.IdentitySource): those are workflows the
# client declared, which the workflow predictor knows; any other program offering or answering tools is an
# open loop.
_NAMED = frozenset({"header", "metadata"})

_FAILURE = re.compile(
    r"^(?:Traceback \(most recent call last\)"
    r"|(?:FAILED|FAIL|ERROR)\b"
    r"|\w*(?:Error|Exception)(?::|$)"
    r"|\{\s*\"error\"\s*:)"
    r"|\bexit (?:code|status):? [1-9]\d*",
    re.MULTILINE,
)


def failed(text: str) -> bool:
    """Whether one tool result reads as a failure."""
    return _FAILURE.search(text) is not None


def _answered(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """The tool results after the last assistant turn: the ones this stage answers."""
    results = []
    for m in reversed(messages):
        if m.role != "tool":
            break
        results.append(m)
    return results


def after_failed_tool(messages: Sequence[ChatMessage]) -> bool:
    """Whether the stage answers tool results of which at least one failed."""
    return any(failed(m.content) for m in _answered(messages))


def loop_state(req: StageRequest, program: Mapping[str, str]) -> LoopState | None:
    """The loop's state for a stage of an open agent loop (a program nobody named, offering tools or
    answering their results), from its history and its program's row; None for any other stage."""
    offers = req.tool_use is not None and req.tool_use.calls_possible
    if req.identity in _NAMED or not (offers or any(m.role == "tool" for m in req.messages)):
        return None
    results = _answered(req.messages)
    return LoopState(
        turn=req.stage,
        attained_tokens=int(program.get(ProgramField.ATTAINED) or 0),
        last_tool_failed=any(failed(m.content) for m in results),
        last_tool_chars=sum(len(m.content) for m in results),
        last_output_tokens=int(program.get(ProgramField.LAST_OUTPUT) or 0),
    )


def history_tokens(messages: Sequence[ChatMessage]) -> int:
    """The prompt an engine without this program's KV prefix must prefill, in ``approx_tokens``: every
    message's text and the calls an assistant made (their arguments are most of a coding agent's turn)."""
    return sum(
        approx_tokens(m.content) + sum(approx_tokens(c.arguments) + 1 for c in m.tool_calls) for m in messages
    )
