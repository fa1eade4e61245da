"""Chimera's engine choice: the paper's Algorithm 1 (§2.4, §3) as written.

NOTE(policy): this is the rule as the paper states it, including its corner: when the least-loaded engine
has zero load (an idle pool, or any idle engine), the slack bound ``(1 + tau) * L_fast`` is zero, so only
other *idle* engines can win on confidence however large ``tau`` is. The improved rule is a separate,
separately named policy (``chimera_plus``) so that results stay comparable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from services.common.types import EngineSnapshot
from services.policy.contract import Selection, alive_engines, check_knobs, scan
from services.policy.estimates import engine_load_ms

COST_NAME = "load_ms"  # the paper's L[m], a time-to-last-token proxy


def select_engine(
    engines: Sequence[EngineSnapshot],
    confidence: Mapping[str, float],
    tau: float,
    delta_s: float,
) -> Selection:
    """Algorithm 1: start from the least-loaded engine; switch to a more confident one within the slack.

    Args:
        engines: snapshots of every registered engine; dead ones are ignored.
        confidence: router confidence q per *model name*; every engine of a model shares it. A model the
            router did not score counts as 0, so it is only ever chosen as the fastest engine.
        tau: latency slack (>= 0); a candidate's load may exceed the fastest engine's by this factor.
        delta_s: confidence margin (>= 0) a candidate must beat the fastest engine's q by.

    Returns:
        The selection with per-engine q, load and test outcomes.

    Raises:
        NoLiveEngine: no engine is alive.
    """
    check_knobs(tau, delta_s)
    alive = alive_engines(engines)
    load = {e.engine_id: engine_load_ms(e) for e in alive}
    # Ties on load (always at start, when every L is 0) go to the faster engine, then to a stable order.
    fast = min(alive, key=lambda e: (load[e.engine_id], e.profile.decode_ms_per_token, e.engine_id))
    l_fast = load[fast.engine_id]
    # The limit of (1 + tau) * 0 is 0 even for tau = inf (where the float product would be NaN).
    bound = l_fast * (1.0 + tau) if l_fast > 0 else 0.0
    return scan(alive, load, confidence, fast, bound, lambda _: delta_s, COST_NAME, tau, delta_s)
