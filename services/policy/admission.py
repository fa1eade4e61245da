"""Admission: whether a new workflow's first stage may join the engine the policy chose, go elsewhere
(a brownout), or must be refused, with how long to wait before trying again.

NOTE(admission): each engine's queue is bounded in *predicted seconds of work*: its in-flight predicted
tokens priced by its measured profile, the paper's L[m] in seconds (the estimate the load balancer itself
uses). A new workflow joins an engine while the work already there is within the bound (that work is
what it waits behind, so the bound is a wait bound; an idle engine always takes one, however large).
Over the bound, the request goes to another engine whose model the router scores within
``brownout_margin`` of the chosen one's, if that engine has room; else it is refused, never queued
without end. Only a workflow's *first* stage is ever turned away: the in-flight accounting already counts
the whole remaining workflow (ŷ covers the later stages), so an admitted workflow's later stages are
always admitted and nothing is stranded half-done.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.common.types import EngineSnapshot
from services.policy.estimates import engine_load_ms, load_ms_per_token
from services.policy.routing import Route

# A refusal asks the caller to wait at least this long, and never longer than the cap.
MIN_RETRY_S = 1.0
MAX_RETRY_S = 600.0
# The dispatcher's default queue bound, which ``chimera queue`` also reads to show how full queues are.
DEFAULT_MAX_QUEUE_S = 120.0


@dataclass(frozen=True, slots=True)
class Bounds:
    max_queue_s: float  # predicted seconds of work an engine may hold; 0 means unbounded
    brownout_margin: float  # confidence a brownout target may have below the chosen model's


@dataclass(frozen=True, slots=True)
class Admission:
    engine_id: str
    model: str
    work_s: float  # predicted seconds of work on that engine before this request (what it waits behind)
    browned_out_from: str | None = None  # the engine the policy chose, when the request went elsewhere
    refused: bool = False
    retry_after_s: float = 0.0


def work_s(e: EngineSnapshot) -> float:
    """Predicted seconds of work the engine holds: L[m] / 1000."""
    return engine_load_ms(e) / 1000.0


def admit(
    route: Route,
    engines: Sequence[EngineSnapshot],
    confidences: Mapping[str, float],
    bounds: Bounds,
    drain_tokens_per_s: Mapping[str, float],
) -> Admission:
    """Admit ``route`` (the policy's choice), brown it out to a close enough engine with room, or refuse.

    ``drain_tokens_per_s``: the measured rate at which each engine releases in-flight predicted tokens
    (missing or 0: unknown, and the profile's own speed prices the wait instead).
    """
    by_id = {e.engine_id: e for e in engines}
    chosen = by_id[route.engine_id]
    w = work_s(chosen)
    if route.branch == "reuse" or bounds.max_queue_s <= 0 or w <= bounds.max_queue_s:
        return Admission(route.engine_id, route.model, w)
    if route.branch != "pinned":
        q_chosen = confidences.get(route.model, 0.0)
        room = [
            (confidences.get(e.model, 0.0), -work_s(e), e.engine_id, e)
            for e in engines
            if e.alive
            and e.engine_id != chosen.engine_id
            and confidences.get(e.model, 0.0) >= q_chosen - bounds.brownout_margin
            and work_s(e) <= bounds.max_queue_s
        ]
        if room:
            _, neg_w, _, best = max(room)
            return Admission(best.engine_id, best.model, -neg_w, browned_out_from=chosen.engine_id)
    wait = retry_after_s(chosen, w - bounds.max_queue_s, drain_tokens_per_s.get(route.engine_id, 0))
    return Admission(route.engine_id, route.model, w, refused=True, retry_after_s=wait)


def retry_after_s(e: EngineSnapshot, excess_s: float, drain_tokens_per_s: float) -> float:
    """How long until ``excess_s`` seconds of the engine's predicted work have drained: at the measured
    drain rate when there is one, else at the profile's own speed; whole seconds, within the limits."""
    if drain_tokens_per_s > 0:
        wait = excess_s * 1000.0 / max(1e-12, load_ms_per_token(e)) / drain_tokens_per_s
    else:
        wait = excess_s
    return float(min(MAX_RETRY_S, max(MIN_RETRY_S, math.ceil(wait))))
