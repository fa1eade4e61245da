"""What an SSE stream has sent of an answer's tool calls, so that its end can finish them from the final
answer: SSE cannot take back what it sent (see NOTE(retries) in ``http_api``)."""

from __future__ import annotations

from services.common.chat import ToolCall, ToolCallPiece


class CallsSent:
    def __init__(self) -> None:
        self._args: dict[int, str] = {}  # call index -> its arguments sent so far

    def note(self, pieces: tuple[ToolCallPiece, ...]) -> None:
        for p in pieces:
            self._args[p.index] = self._args.get(p.index, "") + p.arguments

    def rest(self, calls: tuple[ToolCall, ...]) -> tuple[ToolCallPiece, ...] | None:
        """The pieces that complete ``calls`` after what was sent; None if what was sent is not a prefix of
        them (a re-run answered differently)."""
        if any(i >= len(calls) for i in self._args):
            return None
        out = []
        for i, call in enumerate(calls):
            sent = self._args.get(i)
            if sent is None:
                out.append(ToolCallPiece(i, call.id, call.name, call.arguments))
            elif not call.arguments.startswith(sent):
                return None
            elif len(call.arguments) > len(sent):
                out.append(ToolCallPiece(i, arguments=call.arguments[len(sent) :]))
        return tuple(out)
