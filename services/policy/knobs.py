"""The policy knobs and their defaults: the one source the dispatcher's settings and the simulator share."""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_POLICY = "chimera"


@dataclass(frozen=True, slots=True)
class Knobs:
    """What a policy's decisions depend on besides the pool: the dispatcher's settings hold the same fields
    (``DispatcherSettings.knobs()``), the simulator's ``SimConfig`` too."""

    tau: float = 0.5  # latency slack: a more confident engine may be this much slower
    delta_s: float = 0.05  # confidence margin needed to leave the fastest engine
    aging_rate: float = 20.0  # aging credit in tokens per second of waiting (anti-starvation)
    priority_cap_tokens: int = 8192  # predictions above this count as this much for priority
    # Most tokens a tenant over its fair share is penalised (services.policy.fairness); 0: no fairness term.
    # The aging bound grows by at most fair_cap_tokens / aging_rate seconds (205 s at the defaults).
    fair_cap_tokens: int = 4096
    # Escalation after a failed tool result (services.policy.escalation): off until the live agent benchmark
    # says it pays. Its latency slack is tau unless escalation_tau is set: a first stage trades latency for
    # a marginal gain in confidence, an escalation for a loop that would otherwise almost surely fail.
    escalate: bool = False
    escalation_tau: float | None = None

    @property
    def escalation_slack(self) -> float:
        return self.tau if self.escalation_tau is None else self.escalation_tau

    def __post_init__(self) -> None:
        if not (self.tau >= 0 and self.delta_s >= 0 and (self.escalation_tau or 0.0) >= 0):
            raise ValueError("tau, delta_s and escalation_tau must be >= 0")
        if not (math.isfinite(self.aging_rate) and self.aging_rate > 0):
            raise ValueError("aging_rate must be > 0 (without aging, a long request can starve)")
        if self.priority_cap_tokens < 1:
            raise ValueError("priority_cap_tokens must be >= 1")
        if self.fair_cap_tokens < 0:
            raise ValueError("fair_cap_tokens must be >= 0")


DEFAULT_KNOBS = Knobs()
