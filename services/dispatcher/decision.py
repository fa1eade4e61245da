"""The decision record a dispatch stores with its request (what ``chimera explain`` reads), and the split
of the dispatch time into router, predictor, policy and Redis (the paper's Table 1)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.common.types import DispatchTimings, EngineSnapshot, Prediction
from services.dispatcher.config import DispatcherSettings
from services.policy.admission import Bounds
from services.policy.contract import JobSize, Policy
from services.policy.estimates import engine_load_ms
from services.policy.routing import Route, fed_input


@dataclass(slots=True)
class Timings:
    """Where one dispatch's time went. On a first stage the router and the predictor run at once, so
    their sum can exceed the whole."""

    router_ms: float = 0.0
    predictor_ms: float = 0.0
    policy_ms: float = 0.0
    redis_ms: float = 0.0

    def frozen(self) -> DispatchTimings:
        return DispatchTimings(self.router_ms, self.predictor_ms, self.policy_ms, self.redis_ms)


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def decision_record(
    s: DispatcherSettings,
    policy: Policy,
    branch: str,
    engine: str,
    model: str,
    route: Route,
    engines: Sequence[EngineSnapshot],
    pred: Prediction,
    size: JobSize,
    score: float,
    t_enq: float,
    degraded: Sequence[str],
    t: Timings,
) -> dict[str, Any]:
    """The JSON-ready record of one dispatch."""
    return {
        "policy": policy.name,
        "replica": s.replica_name(),  # which dispatcher replica decided (several may share one Redis)
        "branch": branch,
        "engine": engine,
        "model": model,
        "selection": route.selection.to_record() if route.selection else None,
        "loads_ms": {e.engine_id: engine_load_ms(e) for e in engines},
        "alive": {e.engine_id: e.alive for e in engines},
        "tau": s.tau,
        "delta_s": s.delta_s,
        "y": pred.p50,
        "y90": pred.p90,
        "priority_input": fed_input(policy, size).value,
        "score": score,
        "aging_rate": s.aging_rate,
        "priority_cap_tokens": s.priority_cap_tokens,
        "t_enq": t_enq,
        "degraded": list(degraded),
        "timings_ms": {
            "router": t.router_ms,
            "predictor": t.predictor_ms,
            "policy": t.policy_ms,
            "redis": t.redis_ms,
        },
    }


def detour_record(engine: str, browned_out_from: str, moved_from: str, bounds: Bounds) -> dict[str, Any]:
    """Why the request is not on the engine the policy (or affinity) named: a brownout away from a full
    queue, or a move away from a program's dead engine. Empty when neither happened."""
    out: dict[str, Any] = {}
    if browned_out_from:
        out["brownout"] = {
            "from": browned_out_from,
            "to": engine,
            "max_queue_s": bounds.max_queue_s,
            "margin": bounds.brownout_margin,
        }
    if moved_from:
        out["moved"] = {"from": moved_from, "to": engine, "margin": bounds.brownout_margin}
    return out
