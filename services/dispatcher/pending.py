"""Load this process has routed but its engine snapshots cannot show yet.

NOTE(herding): a dispatch reads every engine's load from Redis, then waits for the router and the predictor,
then chooses. A burst of new workflows all read the same loads before any of them is enqueued, so without
this they all chose the same least-loaded engine (measured: 12 concurrent workflows pinned to a model with
two idle engines all went to the first). Each choice is therefore recorded here at once, and later choices
add to each engine's snapshot the tokens routed to it that the snapshot they read could not include: those
not enqueued yet, and those enqueued after that snapshot was read. Choices are synchronous steps of one
event loop, so within a process they see each other in order; other dispatcher replicas still race (the
engine's ENQUEUE bound holds whatever they decide).

An entry is kept only while some dispatch in progress read its snapshot before the entry was enqueued: once
the oldest such read is younger than the enqueue, every snapshot read now or later includes it. So the list
holds about as many entries as there are dispatches in flight, and each dispatch scans a handful (a fixed
30 s retention held thousands at 200 stages/s, and scanning them was 5% of the dispatcher's event loop).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from services.common.types import EngineSnapshot


@dataclass(slots=True)
class _Routed:
    engine: str
    tokens: int
    enqueued_at: float | None = None  # None: not in Redis yet


class Claim:
    """One dispatch's view: what it adds to the snapshots it read (at ``seen``), and what it routed."""

    def __init__(self, pending: PendingLoad, seen: float) -> None:
        self._pending, self.seen = pending, seen
        self.routed: _Routed | None = None

    def applied(self, engines: Sequence[EngineSnapshot]) -> list[EngineSnapshot]:
        return self._pending.applied(engines, self.seen)

    def take(self, engine: str, tokens: int) -> None:
        """This dispatch chose ``engine`` for ``tokens`` predicted tokens: later choices count them."""
        self.routed = _Routed(engine, tokens)
        self._pending.entries.append(self.routed)

    def enqueued(self) -> None:
        if self.routed is not None:
            self.routed.enqueued_at = self._pending.clock()


class PendingLoad:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.entries: list[_Routed] = []
        self._reads: dict[int, float] = {}  # id(claim) -> when that dispatch in progress read its snapshot

    def applied(self, engines: Sequence[EngineSnapshot], seen: float) -> list[EngineSnapshot]:
        """``engines`` as read at ``seen``, plus the tokens routed to each that such a read missed."""
        extra: dict[str, int] = {}
        for r in self.entries:
            if r.enqueued_at is None or r.enqueued_at > seen:
                extra[r.engine] = extra.get(r.engine, 0) + r.tokens
        return [
            dataclasses.replace(e, inflight_tokens=e.inflight_tokens + extra[e.engine_id])
            if e.engine_id in extra
            else e
            for e in engines
        ]

    @contextlib.contextmanager
    def scope(self) -> Iterator[Claim]:
        """One dispatch, from before its snapshot read to its end; a choice it made but did not enqueue (a
        refusal, an error) is withdrawn on the way out."""
        claim = Claim(self, self.clock())
        self._reads[id(claim)] = claim.seen
        try:
            yield claim
        finally:
            del self._reads[id(claim)]
            r = claim.routed
            if r is not None and r.enqueued_at is None:
                self.entries.remove(r)
            oldest = min(self._reads.values(), default=self.clock())
            self.entries = [e for e in self.entries if e.enqueued_at is None or e.enqueued_at > oldest]
