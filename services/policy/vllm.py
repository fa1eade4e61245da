"""vLLM's engine choice: its data-parallel balancer, by load alone (paper §8).

On a heterogeneous pool the model is then chosen by load alone: confidences, tau and delta_s are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from services.common.types import EngineSnapshot
from services.policy.contract import CandidateCheck, Selection, alive_engines

# vLLM's DP load balancer score weight on waiting requests (vllm/v1/engine/core_client.py, paper §8 [S]).
VLLM_WAITING_WEIGHT = 4
COST_NAME = "vllm_score"  # 4 * waiting + running requests


def vllm_score(e: EngineSnapshot) -> int:
    """vLLM's balancer score: waiting requests weigh four times a running one."""
    return VLLM_WAITING_WEIGHT * e.queued + e.running


def vllm_select(
    engines: Sequence[EngineSnapshot], confidence: Mapping[str, float], tau: float, delta_s: float
) -> Selection:
    """The engine with the lowest ``4 * waiting + running``; ties go to the engine with less in-flight work,
    then the faster engine, then the id: deterministic. It has no slack or margin test (None in checks)."""
    alive = alive_engines(engines)
    pick = min(
        alive,
        key=lambda e: (vllm_score(e), e.inflight_tokens, e.profile.decode_ms_per_token, e.engine_id),
    )
    checks = tuple(
        CandidateCheck(
            engine_id=e.engine_id,
            model=e.model,
            q=float(confidence.get(e.model, 0.0)),
            cost=float(vllm_score(e)),
            slack_ok=None,
            margin_ok=None,
        )
        for e in sorted(alive, key=lambda e: (vllm_score(e), e.engine_id))
    )
    return Selection(pick.engine_id, pick.model, pick.engine_id, COST_NAME, checks, tau, delta_s)
