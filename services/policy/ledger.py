"""``Ledger``: the scheduling state the queue scripts keep in Redis, as plain Python, for the simulator.

Per engine: the in-flight map I[m] (request -> predicted tokens) and its sum (the ``load`` field of
``engine_info``), each tenant's part of it and its weight (the ``tenant_*`` fields: what the fairness term
reads), the queue (request -> static score, smallest served first) and the running claims; per
program: its assignment (affinity). ``dispatch`` makes the decision the dispatcher makes, with the same
functions (``routing``), so the simulator's schedule is the product's; ``tests/test_decisions_agree.py``
runs one trace through this and through the real dispatcher on Redis and compares every decision and queue.

NOTE(ties): the Redis sorted set breaks exact score ties by request id; this queue breaks them by enqueue
time, then enqueue order (the paper's "arrival breaks ties"). Exact ties need two requests with the same
float score: with real clocks that does not happen, while the simulator's shared clock enqueues several
stages in one instant (FCFS and MLFQ scores then tie), where arrival order is the meaningful tie-break.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from services.common.types import EngineProfile, EngineSnapshot
from services.policy.contract import JobSize, Policy
from services.policy.fairness import DEFAULT_WEIGHT, EngineShare, fairness_tokens
from services.policy.knobs import Knobs
from services.policy.routing import (
    Assignment,
    Route,
    candidates,
    choose,
    follow,
    inflight_tokens,
    queue_score,
)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a dispatched request went and what it was charged."""

    route: Route
    score: float
    inflight_tokens: int


@dataclass(slots=True)
class _Book:
    engine_id: str
    model: str
    profile: EngineProfile
    inflight: dict[str, int] = field(default_factory=dict)
    load: int = 0
    queue: list[tuple[float, float, int, str]] = field(default_factory=list)  # (score, t_enq, seq, id)
    running: set[str] = field(default_factory=set)
    tenant_load: dict[str, int] = field(default_factory=dict)  # tenant -> its part of load
    tenant_weight: dict[str, int] = field(default_factory=dict)  # tenant -> weight, while it holds work

    def share(self, tenant: str) -> EngineShare:
        own_weight = self.tenant_weight.get(tenant, 0)
        return EngineShare(
            self.load, self.tenant_load.get(tenant, 0), own_weight, sum(self.tenant_weight.values())
        )


class Ledger:
    def __init__(self, engines: Sequence[tuple[str, str, EngineProfile]]) -> None:
        """``engines``: (engine id, model name, profile) of every engine; all of them are alive."""
        self._books = {eid: _Book(eid, model, profile) for eid, model, profile in engines}
        self._programs: dict[str, Assignment] = {}
        self._scores: dict[str, float] = {}
        self._tenants: dict[str, str] = {}  # request id -> its tenant, for a named one
        self._seq = itertools.count()

    def snapshots(self) -> list[EngineSnapshot]:
        return [
            EngineSnapshot(b.engine_id, b.model, b.profile, b.load, len(b.queue), len(b.running))
            for b in self._books.values()
        ]

    def dispatch(
        self,
        policy: Policy,
        knobs: Knobs,
        program_id: str,
        request_id: str,
        stage: int,
        size_on: Callable[[str], JobSize],
        confidences: Mapping[str, float],
        now: float,
        model_pin: str | None = None,
        tenant: str = "",
        weight: int = DEFAULT_WEIGHT,
    ) -> Placement:
        """The dispatcher's decision for one stage request: route (affinity or the policy), then size it on
        the chosen model (``size_on(model)``: predictions are model-specific, so the dispatcher asks the
        predictor after routing), score, charge, enqueue. ``confidences`` are only read for a program's first
        stage, as the router is only asked then. ``tenant`` "" (no authentication) keeps no tenant
        accounting and gets no fairness term, as in the queue scripts.
        """
        engines = self.snapshots()
        known = self._programs.get(program_id)
        if known is not None:
            route = follow(program_id, known, engines, stage, model_pin)
        else:
            route = choose(policy, candidates(engines, model_pin), confidences, knobs, model_pin)
        self._programs[program_id] = Assignment(route.engine_id, route.model, stage)
        size = size_on(route.model)
        book = self._books[route.engine_id]
        fair = fairness_tokens(weight, book.share(tenant), knobs.fair_cap_tokens) if tenant else 0.0
        score = queue_score(policy, size, now, knobs, fair)
        y = inflight_tokens(policy, size)
        book.inflight[request_id] = y
        book.load += y
        if tenant:
            self._tenants[request_id] = tenant
            book.tenant_weight[tenant] = weight
            book.tenant_load[tenant] = book.tenant_load.get(tenant, 0) + y
        self._push(book, request_id, score, now)
        return Placement(route, score, y)

    def _push(self, book: _Book, request_id: str, score: float, t_enq: float) -> None:
        self._scores[request_id] = score
        heapq.heappush(book.queue, (score, t_enq, next(self._seq), request_id))

    def head(self, engine: str) -> str | None:
        """The request the engine's next claim would take."""
        queue = self._books[engine].queue
        return queue[0][3] if queue else None

    def claim(self, engine: str) -> str:
        """Take the head of the queue into the running set (the CLAIM script's ZPOPMIN)."""
        book = self._books[engine]
        request_id = heapq.heappop(book.queue)[3]
        book.running.add(request_id)
        return request_id

    def requeue(self, engine: str, request_id: str, now: float) -> None:
        """A running request goes back to the queue with its original score (a preemption, or the reaper)."""
        book = self._books[engine]
        book.running.remove(request_id)
        self._push(book, request_id, self._scores[request_id], now)

    def complete(self, engine: str, request_id: str) -> None:
        """A running request finished: its claim and its in-flight charge go (the COMPLETE script)."""
        book = self._books[engine]
        book.running.remove(request_id)
        y = book.inflight.pop(request_id)
        book.load -= y
        del self._scores[request_id]
        tenant = self._tenants.pop(request_id, "")
        if tenant:
            book.tenant_load[tenant] -= y
            if book.tenant_load[tenant] <= 0:  # it holds nothing more: it leaves the active weights
                del book.tenant_load[tenant], book.tenant_weight[tenant]

    def end_program(self, program_id: str) -> None:
        self._programs.pop(program_id, None)

    def score(self, request_id: str) -> float:
        return self._scores[request_id]

    def queue_order(self, engine: str) -> list[str]:
        """Waiting requests in serving order (what ``ZRANGE queue 0 -1`` shows)."""
        return [entry[3] for entry in sorted(self._books[engine].queue)]

    def load(self, engine: str) -> int:
        return self._books[engine].load
