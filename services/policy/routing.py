"""The decisions around a policy that every caller makes the same way: which engines a first stage may use,
affinity for later stages, what the queue score is fed, and what the in-flight accounting is charged.

The dispatcher (with Redis in between) and the simulator's ``Ledger`` both call these functions, so a
simulated schedule is the product's schedule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from services.common.types import EngineSnapshot
from services.policy.contract import JobSize, NoLiveEngine, Policy, PriorityInput, Selection
from services.policy.estimates import load_ms_per_token
from services.policy.fairness import fairness_delay_s
from services.policy.knobs import Knobs

Branch = Literal["new", "pinned", "reuse", "moved", "escalated"]


class AffinityConflict(ValueError):
    """A later stage contradicts its program's assignment: a different pinned model, or a stage going back."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """What the program table holds of a workflow that already has an engine."""

    engine_id: str
    model: str
    stage: int  # the last stage seen


@dataclass(frozen=True, slots=True)
class Route:
    engine_id: str
    model: str
    branch: Branch
    selection: Selection | None  # None when affinity decided (branch "reuse")


def candidates(engines: Sequence[EngineSnapshot], model_pin: str | None) -> list[EngineSnapshot]:
    """The engines a first stage may go to: all of them, or those of the pinned model.

    Raises ``NoLiveEngine`` when none of them is alive.
    """
    pool = [e for e in engines if model_pin is None or e.model == model_pin]
    if not any(e.alive for e in pool):
        raise NoLiveEngine("no live engine" + (f" serves {model_pin!r}" if model_pin else ""))
    return pool


def choose(
    policy: Policy,
    pool: Sequence[EngineSnapshot],
    confidences: Mapping[str, float],
    knobs: Knobs,
    model_pin: str | None = None,
) -> Route:
    """A first stage: the policy picks among ``pool`` (from ``candidates``). A pinned model needs no
    confidences: the policy then picks its least-loaded engine."""
    sel = policy.select(pool, confidences, knobs.tau, knobs.delta_s)
    return Route(sel.engine_id, sel.model, "new" if model_pin is None else "pinned", sel)


def follow(
    program_id: str,
    assignment: Assignment,
    engines: Sequence[EngineSnapshot],
    stage: int,
    model_pin: str | None = None,
) -> Route:
    """A later stage stays on its program's engine (paper §2.4: the workflow's context lives there).

    Raises ``AffinityConflict`` for a contradicting pin or a stage behind the last one, ``NoLiveEngine``
    when the program's engine is not alive (affinity is the rule: it is not moved elsewhere).
    """
    a = assignment
    if model_pin is not None and model_pin != a.model:
        raise AffinityConflict(f"program {program_id} runs on {a.model!r}, not the pinned {model_pin!r}")
    if stage < a.stage:
        raise AffinityConflict(f"stage {stage} is behind the program's last stage {a.stage}")
    snap = next((e for e in engines if e.engine_id == a.engine_id), None)
    if snap is None or not snap.alive:
        raise NoLiveEngine(f"engine {a.engine_id!r} of program {program_id} is not alive")
    return Route(a.engine_id, a.model, "reuse", None)


def relocate(
    program_id: str,
    assignment: Assignment,
    engines: Sequence[EngineSnapshot],
    confidences: Mapping[str, float],
    margin: float,
) -> Route:
    """A later stage whose program's engine is dead (``follow`` refused it): another engine of the same
    model if one is alive (the least loaded), else one of a model whose confidence is within ``margin`` of
    the program's model (the most confident, then the least loaded). Affinity is lost either way, which
    costs a prefill; a workflow that can go on is worth more than its cache.

    Raises ``NoLiveEngine`` naming the dead engine when nothing qualifies.
    """
    a = assignment
    alive = [e for e in engines if e.alive and e.engine_id != a.engine_id]
    same = [e for e in alive if e.model == a.model]
    base = confidences.get(a.model)
    close = [] if base is None else [e for e in alive if confidences.get(e.model, -1.0) >= base - margin]
    pool = same or close
    if not pool:
        raise NoLiveEngine(
            f"engine {a.engine_id!r} of program {program_id} is not alive, and no live engine serves "
            f"{a.model!r} or a model within {margin:g} of its confidence"
        )
    best = min(pool, key=lambda e: (-confidences.get(e.model, 0.0), e.inflight_tokens * load_ms_per_token(e)))
    return Route(best.engine_id, best.model, "moved", None)


def fed_input(policy: Policy, size: JobSize) -> PriorityInput:
    """The size a policy's queue score is fed: its own input where the caller knows it, else the predictor's
    remaining-workflow ŷ. The live dispatcher knows neither a per-stage estimate nor the oracle, so a live
    ``ltr`` or ``vllm-stjf`` is a learned STJF; the simulator knows both."""
    try:
        size.tokens(policy.priority_input)
    except ValueError:
        return PriorityInput.PREDICTED_TOTAL
    return policy.priority_input


def queue_score(policy: Policy, size: JobSize, t_enq: float, knobs: Knobs, fair_tokens: float = 0.0) -> float:
    """The static score the engine's queue sorts by (smallest first).

    ``fair_tokens``: the tenant's fairness penalty (``fairness.fairness_tokens``, at most
    ``knobs.fair_cap_tokens``), applied as a virtual arrival that many seconds of aging credit later, so it
    means the same for every policy; 0 leaves the score exactly as without tenants.
    """
    tokens = size.tokens(fed_input(policy, size))
    t_virtual = t_enq + fairness_delay_s(fair_tokens, knobs.aging_rate) if fair_tokens > 0 else t_enq
    return policy.priority(tokens, t_virtual, knobs.aging_rate, knobs.priority_cap_tokens)


def inflight_tokens(policy: Policy, size: JobSize) -> int:
    """What a dispatch adds to its engine's in-flight accounting (the paper's I[m] entry).

    The predicted remaining tokens, except for a policy fed the oracle: that stands for a perfect predictor,
    so its loads read the same truth.
    """
    if fed_input(policy, size) is PriorityInput.ORACLE_TOTAL and size.oracle_total is not None:
        return size.oracle_total
    return size.predicted_total
