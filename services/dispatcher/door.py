"""The bound on the calls one front door holds open, refused as "busy, come back later".

Each door (gRPC, HTTP) holds its own ``DoorGate``. Past the gate's limit a call is refused with
``Overloaded``, which both doors already answer as overload should be answered (gRPC RESOURCE_EXHAUSTED with
a ``retry-after`` trailer, HTTP 429 with Retry-After in OpenAI's shape). The transports' own hard stops
(gRPC core's ``maximum_concurrent_rpcs``, uvicorn's ``limit_concurrency``) answer neither way: a bare
RESOURCE_EXHAUSTED naming no time to come back (clients other than this SDK read it as "too large"), and
a 503. So they stay only as backstops above the gate (``backstop``), never the limit a busy dispatcher
actually meets.

The gate counts calls, not workflows: ``max_open_requests`` refuses new workflows first, and the gate
catches what that bound lets through (an admitted workflow's later stages, and calls that are not stages).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from services.dispatcher.errors import Overloaded

# A full dispatcher frees a slot as soon as any stream ends, so the caller may come back soon. The one
# figure for both refusals: a new workflow past max_open_requests and any call past a door's gate.
OPEN_RETRY_S = 1.0


def backstop(limit: int) -> int:
    """A transport's hard stop for a gate of ``limit``: far enough above it that the gate refuses first.

    Calls past the gate still hold a transport slot for the moment their refusal takes, and calls the
    gate never sees (health checks, reflection; on HTTP, idle keep-alive connections, which uvicorn counts
    too) need room of their own; twice the limit covers a client fleet that keeps every connection of its
    busiest moment open, idle, plus as many being refused."""
    return 2 * limit


class DoorGate:
    """Counts the calls a door holds open; refuses one past ``limit`` with ``Overloaded``.

    Single-threaded by design: each door runs in the dispatcher's one asyncio loop, and ``held`` never
    awaits between the check and the count, so no lock is needed."""

    def __init__(self, limit: int, retry_after_s: float = OPEN_RETRY_S) -> None:
        if limit < 1:
            raise ValueError(f"a door gate needs a limit of at least 1, not {limit}")
        self.limit = limit
        self._retry_after_s = retry_after_s
        self._open = 0

    @property
    def open(self) -> int:
        """Calls held now."""
        return self._open

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold one place for the block; raises ``Overloaded`` on entry, counting nothing, when full.

        The place is given back however the block ends (returned, raised, cancelled), so a client that
        goes away mid-stream frees it as surely as one that reads to the end."""
        if self._open >= self.limit:
            raise Overloaded(
                f"this door holds {self._open} open calls, its limit; retry later", self._retry_after_s
            )
        self._open += 1
        try:
            yield
        finally:
            self._open -= 1
