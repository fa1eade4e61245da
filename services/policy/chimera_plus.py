"""chimera-plus: Algorithm 1's scan priced by completion time, with a margin priced by occupancy.

The improved rule beside the paper's (``chimera``): the same scan (descending q; the first candidate within
the slack and above the margin wins), but engines are compared by ``estimates.completion_ms`` instead of
L[m], and the confidence margin grows with the candidate's occupancy (``plus_margin``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from services.common.types import EngineSnapshot
from services.policy.contract import Selection, alive_engines, check_knobs, scan
from services.policy.estimates import completion_ms, occupancy

COST_NAME = "completion_ms"  # predicted completion of a nominal new workflow (estimates.completion_ms)


def plus_margin(e: EngineSnapshot, cost_ratio: float, delta_s: float) -> float:
    """Confidence a candidate ``cost_ratio`` times slower than the fastest must add: ``delta_s`` on an idle
    engine, rising with its occupancy to ``delta_s * cost_ratio`` on a full one.

    Why: the margin is the price of the strong engine's capacity. The paper's flat ``delta_s`` spends that
    capacity on whichever workflows arrive while it has slack, and once the engine is full the workflows
    the router expects to gain most find it taken; pricing a full engine by its cost ratio keeps it for
    them. An idle engine's capacity is not scarce, though: a fixed ``delta_s * cost_ratio`` left it idle on a
    light pool, where a strong model is free to use (chimera-plus tied the paper rule there).
    """
    return delta_s * (1.0 + (max(1.0, cost_ratio) - 1.0) * occupancy(e))


def plus_select(
    engines: Sequence[EngineSnapshot], confidence: Mapping[str, float], tau: float, delta_s: float
) -> Selection:
    """Algorithm 1's scan on ``completion_ms`` with the occupancy-priced margin (module docstring)."""
    check_knobs(tau, delta_s)
    alive = alive_engines(engines)
    cost = {e.engine_id: completion_ms(e) for e in alive}
    fast = min(alive, key=lambda e: (cost[e.engine_id], e.engine_id))
    c_fast = cost[fast.engine_id]

    def margin(e: EngineSnapshot) -> float:
        return plus_margin(e, cost[e.engine_id] / c_fast, delta_s)

    return scan(alive, cost, confidence, fast, c_fast * (1.0 + tau), margin, COST_NAME, tau, delta_s)
