"""Escalation: after a failed tool result, the next stage of a program may move to a stronger model.

The paper routes a workflow once, on its first stage, and keeps it there (its context lives on that
engine). An agent loop tells us more as it goes: a test run that failed is evidence that the model it ran
on will not get there. Of the 55 real coding-agent loops that went on after a failed ``run_tests``
(bench/data/agent, temperature 0), none recovered, while the 1.5B passed 9 of the 24 problems the 0.5B
failed. So after a failure the program's own model is worth next to nothing on this task, and any model the
router rated stronger for it may be worth the move. The rule is Algorithm 1 once more, on that evidence,
with the price of the move in it:

- stay: cost ``completion_ms(current)``; its KV prefix is warm there, so the history costs nothing more;
- move to engine e of another model: cost ``completion_ms(e)`` plus the prefill of the whole history on e
  (``prefix_tokens x e.prefill_ms_per_token``): that is the KV prefix the move throws away;
- e qualifies when the router's first-stage confidence in its model is at least delta_s above the current
  model's (escalation only goes up, so a loop never moves back to a model it came from) and its cost is
  within (1 + tau) of staying (``Knobs.escalation_slack``: tau, or ``escalation_tau`` when set); the most
  confident qualifying engine wins (ties: the cheaper move). None
  qualifies: the program stays.

``completion_ms`` and not the paper's L[m], because L is 0 on an idle engine and would let no move through
on an idle pool (the corner ``chimera-plus`` exists for). Pure: the dispatcher calls it on the program's
row and the engines' snapshots; nothing here reads Redis or a clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.common.types import EngineSnapshot
from services.policy.estimates import completion_ms
from services.policy.knobs import Knobs


@dataclass(frozen=True, slots=True)
class EscalationCheck:
    """How one engine of another model fared against staying."""

    engine_id: str
    model: str
    confidence: float
    move_ms: float  # completion_ms on it plus the history's prefill there
    prefix_ms: float  # of move_ms, the prefill of the history the move loses
    stronger: bool  # confidence >= the current model's + delta_s
    within_slack: bool  # move_ms <= (1 + slack) * stay_ms

    @property
    def qualifies(self) -> bool:
        return self.stronger and self.within_slack


@dataclass(frozen=True, slots=True)
class Escalation:
    """The decision and how it was reached (the decision record keeps ``to_record``)."""

    from_engine: str
    confidence: float  # the current model's, from the first stage
    slack: float  # the latency slack the moves were held to
    stay_ms: float
    prefix_tokens: int
    checks: tuple[EscalationCheck, ...]
    to: EscalationCheck | None  # None: the program stays on its engine

    def to_record(self) -> dict[str, Any]:
        return {
            "from": self.from_engine,
            "to": self.to.engine_id if self.to else None,
            "confidence": round(self.confidence, 4),
            "slack": self.slack,
            "stay_ms": round(self.stay_ms, 1),
            "prefix_tokens": self.prefix_tokens,
            "checks": [
                {
                    "engine": c.engine_id,
                    "model": c.model,
                    "confidence": round(c.confidence, 4),
                    "move_ms": round(c.move_ms, 1),
                    "prefix_ms": round(c.prefix_ms, 1),
                    "stronger": c.stronger,
                    "within_slack": c.within_slack,
                }
                for c in self.checks
            ],
        }


def escalate(
    current: EngineSnapshot,
    engines: Sequence[EngineSnapshot],
    confidences: Mapping[str, float],
    prefix_tokens: int,
    knobs: Knobs,
) -> Escalation:
    """Whether the stage after a failed tool result leaves ``current`` (the program's engine), and for which
    engine. ``confidences``: the router's per model from the program's first stage; a model it has no
    confidence for is never a target (nothing says it is stronger)."""
    stay_ms = completion_ms(current)
    q_here = confidences.get(current.model, 0.0)
    checks = []
    for e in engines:
        if not e.alive or e.model == current.model or e.model not in confidences:
            continue
        prefix_ms = max(0, prefix_tokens) * e.profile.prefill_ms_per_token
        move_ms = completion_ms(e) + prefix_ms
        q = confidences[e.model]
        checks.append(
            EscalationCheck(
                e.engine_id,
                e.model,
                q,
                move_ms,
                prefix_ms,
                stronger=q >= q_here + knobs.delta_s,
                within_slack=move_ms <= (1.0 + knobs.escalation_slack) * stay_ms,
            )
        )
    best = min((c for c in checks if c.qualifies), key=lambda c: (-c.confidence, c.move_ms), default=None)
    return Escalation(
        current.engine_id, q_here, knobs.escalation_slack, stay_ms, prefix_tokens, tuple(checks), best
    )
