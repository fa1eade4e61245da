"""When a refused or broken call is worth sending again, and after how long.

Two failures are retried. RESOURCE_EXHAUSTED with a ``retry-after`` (the pool is busy; the front door
says when to come back, from the engine's measured drain rate) turns a burst into a short wait instead of
a failed workflow. UNAVAILABLE (a dispatcher restarting, Redis away for longer than the services ride out,
a broken connection) is retried with the same ``request_id``: the dispatcher re-attaches the retry to the
request it already runs, so nothing is generated twice. A request that is too large or malformed fails
the same way every time and is never retried. The waits never exceed the policy's budget, so a pool that
stays down still ends the call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tenacity

from services.sdk.errors import ChimeraError, OverloadedError, UnavailableError


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    budget_s: float = 120.0  # total time spent waiting between tries, at most
    default_wait_s: float = 1.0  # when the server said nothing about when to come back
    max_wait_s: float = 30.0  # one wait, at most (a far-off Retry-After is re-asked sooner)
    unavailable: bool = True  # also retry UNAVAILABLE (only safe when every try carries the same request_id)

    def retrying(self) -> tenacity.AsyncRetrying:
        """``async for attempt in policy.retrying(): with attempt: ...`` re-runs the block while it raises
        a retryable ``ChimeraError``; the last error is re-raised once the budget is spent."""
        return tenacity.AsyncRetrying(**self._tenacity())

    def retrying_sync(self) -> tenacity.Retrying:
        """The blocking twin of ``retrying``."""
        return tenacity.Retrying(**self._tenacity())

    def _tenacity(self) -> dict[str, Any]:
        return {
            "retry": tenacity.retry_if_exception(self.retryable),
            "wait": self._wait,
            "stop": tenacity.stop_after_delay(self.budget_s),
            "reraise": True,
        }

    def retryable(self, exc: BaseException) -> bool:
        return isinstance(exc, OverloadedError) or (self.unavailable and isinstance(exc, UnavailableError))

    def _wait(self, state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        told = exc.retry_after_s if isinstance(exc, ChimeraError) else None
        return min(self.max_wait_s, told if told is not None else self.default_wait_s)


NO_RETRY = RetryPolicy(budget_s=0.0)


class Replay:
    """The text a caller has already seen, per attempt, across the tries of one request: a re-attached
    stream starts from the request's first event again, and only what is new goes out."""

    def __init__(self) -> None:
        self._sent: dict[int, int] = {}  # attempt -> characters already handed to the caller
        self._seen: dict[int, int] = {}  # attempt -> characters received by the current try

    def new_try(self) -> None:
        self._seen = {}

    def fresh(self, text: str, attempt: int) -> str:
        """The part of a delta the caller has not seen yet ("" when the whole delta is a replay)."""
        start = self._seen.get(attempt, 0)
        self._seen[attempt] = start + len(text)
        skip = self._sent.get(attempt, 0) - start
        out = text[max(0, skip) :]
        if out:
            self._sent[attempt] = start + len(text)
        return out
