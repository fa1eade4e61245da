"""Scheduling policy: which engine serves a workflow, and in which order an engine's queue is served.

Pure functions over frozen snapshots: no Redis, gRPC or clock inside. The dispatcher, the baselines and the
benchmark simulator call these same functions, so a simulated result speaks for the product's decisions.

NOTE(policy): ``select_engine`` is the paper's Algorithm 1 (§2.4, §3) as written, including its corner:
when the least-loaded engine has zero load (an idle pool, or any idle engine), the slack bound
``(1 + tau) * L_fast`` is zero, so only other *idle* engines can win on confidence however large ``tau``
is. An improved rule belongs in a separate, separately named policy so that results stay comparable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, Protocol

from services.common.types import EngineSnapshot
from services.dispatcher.baselines import fcfs_priority, mlfq_priority, plus_select, vllm_select
from services.dispatcher.errors import NoLiveEngine

# Boundary comparisons (L == bound, q == q_fast + delta_s) must pass as the paper's <= and >= say; float
# sums such as 0.5 + 0.05 are not exact, so ties are compared with this absolute tolerance.
_EPS = 1e-12


def engine_load_ms(snapshot: EngineSnapshot) -> float:
    """The paper's TTLT proxy L[m] = P_m * decode_ms_per_token / max_batch_size (§2.4)."""
    profile = snapshot.profile
    return snapshot.inflight_tokens * profile.decode_ms_per_token / max(1, profile.max_batch_size)


@dataclass(frozen=True, slots=True)
class CandidateCheck:
    """One engine as the scan saw it: its inputs and the two tests of Algorithm 1 line d."""

    engine_id: str
    model: str
    q: float
    load_ms: float
    slack_ok: bool  # L <= (1 + tau) * L_fast
    margin_ok: bool  # q >= q[fast] + delta_s


@dataclass(frozen=True, slots=True)
class Selection:
    """The decision and everything needed to explain it later (``chimera explain``)."""

    engine_id: str
    model: str
    fast_engine: str
    # Every alive engine in scan order (descending q), including those after the winner.
    checks: tuple[CandidateCheck, ...]
    tau: float
    delta_s: float

    @property
    def load_ms(self) -> dict[str, float]:
        return {c.engine_id: c.load_ms for c in self.checks}

    @property
    def q(self) -> dict[str, float]:
        return {c.engine_id: c.q for c in self.checks}

    @property
    def switched(self) -> bool:
        """True when confidence moved the request off the fastest engine."""
        return self.engine_id != self.fast_engine

    def to_record(self) -> dict[str, Any]:
        """A JSON-ready form for the request's decision record."""
        return {
            "engine": self.engine_id,
            "model": self.model,
            "fast_engine": self.fast_engine,
            "switched": self.switched,
            "tau": _finite(self.tau),
            "delta_s": _finite(self.delta_s),
            "candidates": [
                {
                    "engine": c.engine_id,
                    "model": c.model,
                    "q": c.q,
                    "load_ms": c.load_ms,
                    "slack_ok": c.slack_ok,
                    "margin_ok": c.margin_ok,
                }
                for c in self.checks
            ],
        }


def _finite(x: float) -> float | str:
    # JSON has no infinity; the record keeps it readable instead of failing to serialise.
    return x if math.isfinite(x) else repr(x)


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
    if tau < 0 or delta_s < 0:
        raise ValueError("tau and delta_s must be >= 0")
    alive = [e for e in engines if e.alive]
    if not alive:
        raise NoLiveEngine("no live engine is registered")
    load = {e.engine_id: engine_load_ms(e) for e in alive}
    q = {e.engine_id: float(confidence.get(e.model, 0.0)) for e in alive}
    # Ties on load (always at start, when every L is 0) go to the faster engine, then to a stable order.
    fast = min(alive, key=lambda e: (load[e.engine_id], e.profile.decode_ms_per_token, e.engine_id))
    l_fast, q_fast = load[fast.engine_id], q[fast.engine_id]
    # The limit of (1 + tau) * 0 is 0 even for tau = inf (where the float product would be NaN).
    bound = l_fast * (1.0 + tau) if l_fast > 0 else 0.0
    # Descending q; equal q prefers the lighter engine, so a homogeneous pool picks the least loaded.
    order = sorted(alive, key=lambda e: (-q[e.engine_id], load[e.engine_id], e.engine_id))
    checks = tuple(
        CandidateCheck(
            engine_id=e.engine_id,
            model=e.model,
            q=q[e.engine_id],
            load_ms=load[e.engine_id],
            slack_ok=load[e.engine_id] <= bound + _EPS,
            margin_ok=q[e.engine_id] >= q_fast + delta_s - _EPS,
        )
        for e in order
    )
    chosen = next((c for c in checks if c.slack_ok and c.margin_ok), None)
    if chosen is None:
        return Selection(fast.engine_id, fast.model, fast.engine_id, checks, tau, delta_s)
    return Selection(chosen.engine_id, chosen.model, fast.engine_id, checks, tau, delta_s)


def priority_score(predicted_tokens: int, enqueued_unix: float, aging_rate: float, cap: int) -> float:
    """Static queue score (smaller is served first): ``min(y, cap) + aging_rate * t_enq``.

    Why a static score ages correctly: the effective priority of a waiting request is
    ``y - beta * (now - t_enq)`` (linear aging credit ``beta = aging_rate`` tokens per second). At any
    instant ``beta * now`` is the same for every entry, so ordering by ``y + beta * t_enq`` is the same
    order, and the Redis sorted set never needs re-scoring.

    Bound. Write ``s(x) = min(y_x, cap) + beta * t_x`` with ``y_x >= 0`` (negative predictions are clamped
    to 0) and ``beta > 0``. Claim: a request r is never served after a request r' that arrived later than
    ``t_r + min(y_r, cap) / beta``. Proof: suppose r' is served while r waits. The queue pops the minimum,
    so ``s(r') <= s(r)``, i.e. ``min(y_r', cap) + beta * t_r' <= min(y_r, cap) + beta * t_r``. The left
    side is at least ``beta * t_r'``, hence ``t_r' <= t_r + min(y_r, cap) / beta``. So every request that
    arrives after that instant is behind r; r waits only for the finitely many requests that arrived
    before ``t_r + cap / beta`` (at most ``cap / beta`` seconds of later arrivals). The reaper re-queues a
    request with its original score, so the bound survives worker crashes. The cap keeps a wildly
    over-predicted request from waiting longer than ``cap / beta`` seconds of arrivals.
    """
    if aging_rate <= 0:
        raise ValueError("aging_rate must be > 0 (without aging, a long request can starve)")
    return float(max(0, min(predicted_tokens, cap))) + aging_rate * enqueued_unix


def wait_bound_s(predicted_tokens: int, aging_rate: float, cap: int) -> float:
    """Seconds after its arrival beyond which no newcomer overtakes a request (see ``priority_score``)."""
    return max(0, min(predicted_tokens, cap)) / aging_rate


class SelectFn(Protocol):
    def __call__(
        self,
        engines: Sequence[EngineSnapshot],
        confidence: Mapping[str, float],
        tau: float,
        delta_s: float,
    ) -> Selection: ...


class PriorityFn(Protocol):
    def __call__(self, predicted_tokens: int, enqueued_unix: float, aging_rate: float, cap: int) -> float: ...


@dataclass(frozen=True, slots=True)
class Policy:
    """A named pair: how to pick an engine, and how an engine orders its queue, fed ``priority_input``:
    ``predicted`` (the predictor's remaining-workflow median) or ``attained`` (output tokens the program's
    finished stages produced, MLFQ's attained service)."""

    name: str
    select: SelectFn
    priority: PriorityFn
    priority_input: Literal["predicted", "attained"] = "predicted"


# Read-only on purpose: policies are chosen by name in config, never patched at run time.
# The baselines (paper §8) and the improved rule: what each one's priority must be fed is documented in
# ``services.dispatcher.baselines``.
POLICIES: Mapping[str, Policy] = MappingProxyType(
    {
        "chimera": Policy("chimera", select_engine, priority_score),
        "chimera-plus": Policy("chimera-plus", plus_select, priority_score),
        "vllm": Policy("vllm", vllm_select, fcfs_priority),
        "vllm-stjf": Policy("vllm-stjf", vllm_select, priority_score),
        "ltr": Policy("ltr", vllm_select, priority_score),
        "mlfq": Policy("mlfq", vllm_select, mlfq_priority, "attained"),
    },
)
