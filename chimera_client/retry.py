"""When a refused or broken call is worth sending again, and after how long.

Two failures are retried. RESOURCE_EXHAUSTED with a ``retry-after`` (the pool is busy; the front door
says when to come back, from the engine's measured drain rate) turns a burst into a short wait instead of
a failed workflow. UNAVAILABLE (a dispatcher restarting, Redis away for longer than the services ride out,
a broken connection) is retried with the same ``request_id``: the dispatcher re-attaches the retry to the
request it already runs, so nothing is generated twice. A request that is too large or malformed fails
the same way every time and is never retried. The waits never exceed the policy's budget, so a pool that
stays down still ends the call.

NOTE(budget): the budget runs from a call's first failure, not from its start, and starts again once a try
delivers something. A stage's stream may rightly run for minutes (queued behind others, then generating);
counted from the start, a stream broken after as long as the budget got no retry at all, and its workflow
failed on a dispatcher restart that a retry would have ridden out.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from types import TracebackType

from chimera_client.errors import ChimeraError, OverloadedError, UnavailableError


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    # Time spent retrying, at most, from the first failure since the call last made progress (the last
    # wait is cut to what is left): NOTE(budget).
    budget_s: float = 120.0
    default_wait_s: float = 1.0  # when the server said nothing about when to come back
    max_wait_s: float = 30.0  # one wait, at most (a far-off Retry-After is re-asked sooner)
    # The n-th refusal in a row waits backoff**(n-1) times the base: a Retry-After is the server's estimate
    # from the drain rate it measured, and a client refused again after waiting it out has learnt that
    # the estimate was short (or that many others came back with it); waiting longer each time spreads
    # the returns out instead of re-forming the burst.
    backoff: float = 2.0
    unavailable: bool = True  # also retry UNAVAILABLE (only safe when every try carries the same request_id)
    # Each wait is stretched by a random fraction of itself up to this much: clients refused together (a
    # burst over the bound) are told the same Retry-After and would otherwise all come back at once.
    jitter: float = 0.5

    def retrying(self) -> Tries:
        """``async for attempt in policy.retrying(): with attempt: ...`` re-runs the block while it raises
        a retryable ``ChimeraError``; the last error is re-raised once the budget is spent."""
        return Tries(self)

    def retrying_sync(self) -> Tries:
        """The blocking twin of ``retrying``: ``for attempt in policy.retrying_sync(): with attempt: ...``."""
        return Tries(self)

    def retryable(self, exc: BaseException) -> bool:
        return isinstance(exc, OverloadedError) or (self.unavailable and isinstance(exc, UnavailableError))

    def wait_s(self, exc: BaseException, failures: int = 1) -> float:
        """How long to wait after ``exc``, the ``failures``-th retryable failure in a row: what the server
        said, else the default, grown by ``backoff`` per earlier failure, at most ``max_wait_s``; then
        stretched by up to ``jitter`` of itself (never shorter than the server said)."""
        told = exc.retry_after_s if isinstance(exc, ChimeraError) else None
        base = told if told is not None else self.default_wait_s
        base *= max(1.0, self.backoff) ** max(0, failures - 1)
        return min(self.max_wait_s, base) * (1.0 + random.uniform(0.0, max(0.0, self.jitter)))


class Tries:
    """The tries of one call under a policy: iterated (sync or async) it hands out one ``Attempt`` per
    try, sleeping between them, and stops after a try that did not fail with a retryable error.

    A plain loop rather than a retry library, so that the client distribution needs only grpcio and
    protobuf."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._policy = policy
        self._failing_since: float | None = None  # the first failure since the last progress
        self._tried = False
        self._wait_s: float | None = None  # set by a failed try that is to be retried
        self._failures = 0  # retryable failures since the last progress (the backoff's exponent)

    def _next_wait(self) -> float | None:
        """Seconds to sleep before the next try; None when there is no next try."""
        if not self._tried:
            self._tried = True
            return 0.0
        wait, self._wait_s = self._wait_s, None
        return wait

    def __iter__(self) -> Tries:
        return self

    def __next__(self) -> Attempt:
        wait = self._next_wait()
        if wait is None:
            raise StopIteration
        if wait > 0:
            time.sleep(wait)
        return Attempt(self)

    def __aiter__(self) -> Tries:
        return self

    async def __anext__(self) -> Attempt:
        wait = self._next_wait()
        if wait is None:
            raise StopAsyncIteration
        if wait > 0:
            await asyncio.sleep(wait)
        return Attempt(self)

    def failed(self, exc: BaseException) -> bool:
        """Whether a try that raised ``exc`` is tried again (then its wait is recorded)."""
        if not self._policy.retryable(exc):
            return False
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        left = self._policy.budget_s - (now - self._failing_since)
        if left <= 0:
            return False
        self._failures += 1
        self._wait_s = min(self._policy.wait_s(exc, self._failures), left)
        return True

    def progressed(self) -> None:
        """The current try delivered something: a failure after it starts a fresh budget and backoff."""
        self._failing_since, self._failures = None, 0


class Attempt:
    """``with attempt:`` around one try: a retryable failure within the budget is kept from the caller
    (the loop goes on); any other exception, including a caller that stops reading a stream
    (GeneratorExit, CancelledError), passes through at once."""

    def __init__(self, tries: Tries) -> None:
        self._tries = tries

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> bool:
        return e is not None and self._tries.failed(e)


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
