"""What a stage's history says about its last tool run: whether it failed, and how long the history is.

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
from collections.abc import Sequence

from services.common.tokens import approx_tokens
from services.common.types import ChatMessage

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


def after_failed_tool(messages: Sequence[ChatMessage]) -> bool:
    """Whether the stage answers tool results of which at least one failed."""
    results = []
    for m in reversed(messages):
        if m.role != "tool":
            break
        results.append(m)
    return any(failed(m.content) for m in results)


def history_tokens(messages: Sequence[ChatMessage]) -> int:
    """The prompt an engine without this program's KV prefix must prefill, in ``approx_tokens``: every
    message's text and the calls an assistant made (their arguments are most of a coding agent's turn)."""
    return sum(
        approx_tokens(m.content) + sum(approx_tokens(c.arguments) + 1 for c in m.tool_calls) for m in messages
    )
