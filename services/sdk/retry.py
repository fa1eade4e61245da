"""When a refused call is worth sending again, and after how long.

The front door says when to come back (``retry-after`` on RESOURCE_EXHAUSTED, from the engine's measured
drain rate); a client that honours it turns a burst into a short wait instead of a failed workflow. Only
refusals the server marks as busy are retried: a request that is too large or malformed fails the same way
every time. The wait never exceeds the caller's budget, so a pool that stays full still ends the call.
"""

from __future__ import annotations

from dataclasses import dataclass

import tenacity

from services.sdk.errors import ChimeraError, OverloadedError


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    budget_s: float = 120.0  # total time spent waiting between tries, at most
    default_wait_s: float = 1.0  # when the server said nothing about when to come back
    max_wait_s: float = 30.0  # one wait, at most (a far-off Retry-After is re-asked sooner)

    def retrying(self) -> tenacity.AsyncRetrying:
        """``async for attempt in policy.retrying(): with attempt: ...`` re-runs the block while it raises
        a retryable ``ChimeraError``; the last error is re-raised once the budget is spent."""
        return tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(retryable),
            wait=self._wait,
            stop=tenacity.stop_after_delay(self.budget_s),
            reraise=True,
        )

    def _wait(self, state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        told = exc.retry_after_s if isinstance(exc, ChimeraError) else None
        return min(self.max_wait_s, told if told is not None else self.default_wait_s)


def retryable(exc: BaseException) -> bool:
    """Busy, with a time to come back: the same request will be admitted once the queue drains."""
    return isinstance(exc, OverloadedError)
