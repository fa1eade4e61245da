"""What every policy is: the types a policy takes and returns, and the one error it raises.

A policy is a named pair of pure functions (``Policy``): ``select`` picks the engine of a workflow's first
stage from engine snapshots and router confidences; ``priority`` turns a job size and an enqueue time into
the static score the engine's queue sorts by (smallest served first). Neither touches Redis, gRPC or a
clock, so the dispatcher, the simulator and the inspector run the very same decisions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from services.common.types import EngineSnapshot

# Boundary comparisons (L == bound, q == q_fast + delta_s) must pass as the paper's <= and >= say; float
# sums such as 0.5 + 0.05 are not exact, so ties are compared with this absolute tolerance.
EPS = 1e-12


class NoLiveEngine(LookupError):
    """No alive engine can take the request. The dispatcher wraps it in its own UNAVAILABLE error."""


class PriorityInput(StrEnum):
    """What number a policy's ``priority`` function orders jobs by (its ``size_tokens`` argument)."""

    ARRIVAL = "arrival"  # nothing: arrival order alone (FCFS); the size is ignored
    PREDICTED_TOTAL = "predicted_total"  # the predictor's median of the workflow's remaining tokens (ŷ)
    ATTAINED = "attained"  # output tokens the workflow's finished stages produced (MLFQ's attained service)
    PER_STAGE = "per_stage"  # an estimate of this stage's own output alone (SJF / LTR: workflow-blind)
    ORACLE_TOTAL = "oracle_total"  # the true remaining tokens: a reference only a simulator knows


@dataclass(frozen=True, slots=True)
class JobSize:
    """Every size a caller knows for one stage request; a policy reads the one its ``PriorityInput`` names.

    ``per_stage`` and ``oracle_total`` are None where nobody knows them (the live dispatcher has neither).
    """

    predicted_total: int
    attained: int = 0
    per_stage: int | None = None
    oracle_total: int | None = None

    def tokens(self, what: PriorityInput) -> int:
        """The size ``what`` names; raises ``ValueError`` if this caller does not know it."""
        value = {
            PriorityInput.ARRIVAL: 0,
            PriorityInput.PREDICTED_TOTAL: self.predicted_total,
            PriorityInput.ATTAINED: self.attained,
            PriorityInput.PER_STAGE: self.per_stage,
            PriorityInput.ORACLE_TOTAL: self.oracle_total,
        }[what]
        if value is None:
            raise ValueError(f"this caller does not know the {what.value} size")
        return value


@dataclass(frozen=True, slots=True)
class CandidateCheck:
    """One engine as a selection saw it.

    ``cost`` is what the policy compares engines by, in the unit its ``Selection.cost_name`` names.
    ``slack_ok`` and ``margin_ok`` are the two tests of Algorithm 1's scan (cost within the slack of the
    cheapest engine; confidence above the cheapest engine's by the margin); None where the policy has no
    such test (vLLM's balancer looks at load alone).
    """

    engine_id: str
    model: str
    q: float
    cost: float
    slack_ok: bool | None
    margin_ok: bool | None


@dataclass(frozen=True, slots=True)
class Selection:
    """The decision and everything needed to explain it later (``chimera explain``)."""

    engine_id: str
    model: str
    fast_engine: str  # the cheapest engine: where the policy starts before confidence may move it
    cost_name: str  # what CandidateCheck.cost holds, e.g. "load_ms" (the paper's L[m])
    # Every alive engine in the policy's scan order, including those after the winner.
    checks: tuple[CandidateCheck, ...]
    tau: float
    delta_s: float

    @property
    def cost(self) -> dict[str, float]:
        return {c.engine_id: c.cost for c in self.checks}

    @property
    def q(self) -> dict[str, float]:
        return {c.engine_id: c.q for c in self.checks}

    @property
    def switched(self) -> bool:
        """True when confidence moved the request off the cheapest engine."""
        return self.engine_id != self.fast_engine

    def to_record(self) -> dict[str, Any]:
        """A JSON-ready form for the request's decision record."""
        return {
            "engine": self.engine_id,
            "model": self.model,
            "fast_engine": self.fast_engine,
            "switched": self.switched,
            "cost_name": self.cost_name,
            "tau": _finite(self.tau),
            "delta_s": _finite(self.delta_s),
            "candidates": [
                {
                    "engine": c.engine_id,
                    "model": c.model,
                    "q": c.q,
                    "cost": c.cost,
                    "slack_ok": c.slack_ok,
                    "margin_ok": c.margin_ok,
                }
                for c in self.checks
            ],
        }


def _finite(x: float) -> float | str:
    # JSON has no infinity; the record keeps it readable instead of failing to serialise.
    return x if math.isfinite(x) else repr(x)


class SelectFn(Protocol):
    def __call__(
        self,
        engines: Sequence[EngineSnapshot],
        confidence: Mapping[str, float],
        tau: float,
        delta_s: float,
    ) -> Selection: ...


class PriorityFn(Protocol):
    """``size_tokens`` is the size the policy's ``priority_input`` names (``JobSize.tokens``)."""

    def __call__(self, size_tokens: int, enqueued_unix: float, aging_rate: float, cap: int) -> float: ...


@dataclass(frozen=True, slots=True)
class Policy:
    """A named pair: how to pick an engine, and how an engine orders its queue by ``priority_input``."""

    name: str
    select: SelectFn
    priority: PriorityFn
    priority_input: PriorityInput


def alive_engines(engines: Sequence[EngineSnapshot]) -> list[EngineSnapshot]:
    """The engines a selection may choose from; raises ``NoLiveEngine`` when there is none."""
    alive = [e for e in engines if e.alive]
    if not alive:
        raise NoLiveEngine("no live engine is registered")
    return alive


def scan(
    alive: Sequence[EngineSnapshot],
    cost: Mapping[str, float],
    confidence: Mapping[str, float],
    fast: EngineSnapshot,
    bound: float,
    margin: Callable[[EngineSnapshot], float],
    cost_name: str,
    tau: float,
    delta_s: float,
) -> Selection:
    """Algorithm 1's scan, shared by the rules that price engines differently: engines by descending q
    (equal q: the cheaper first, then the id); the first whose cost is within ``bound`` and whose q beats the
    cheapest engine's (``fast``) by ``margin(engine)`` wins; if none does, ``fast`` keeps the request."""
    q = {e.engine_id: float(confidence.get(e.model, 0.0)) for e in alive}
    q_fast = q[fast.engine_id]
    order = sorted(alive, key=lambda e: (-q[e.engine_id], cost[e.engine_id], e.engine_id))
    checks = tuple(
        CandidateCheck(
            engine_id=e.engine_id,
            model=e.model,
            q=q[e.engine_id],
            cost=cost[e.engine_id],
            slack_ok=cost[e.engine_id] <= bound + EPS,
            margin_ok=q[e.engine_id] >= q_fast + margin(e) - EPS,
        )
        for e in order
    )
    chosen = next((c for c in checks if c.slack_ok and c.margin_ok), None)
    pick = (chosen.engine_id, chosen.model) if chosen else (fast.engine_id, fast.model)
    return Selection(*pick, fast.engine_id, cost_name, checks, tau, delta_s)


def check_knobs(tau: float, delta_s: float) -> None:
    if tau < 0 or delta_s < 0:
        raise ValueError("tau and delta_s must be >= 0")
