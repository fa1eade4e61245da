"""Queue scores: shortest total job first with linear aging (Chimera's), and first come first served.

A score is static: it is computed once at enqueue and the engine's sorted set serves the smallest first, so
no re-scoring pass ever runs (the proof is in ``priority_score``).
"""

from __future__ import annotations


def priority_score(size_tokens: int, enqueued_unix: float, aging_rate: float, cap: int) -> float:
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

    Across tenants (``fairness``). A tenant over its fair share is scored at a virtual arrival
    ``t + d`` with ``0 <= d <= D = fair_cap / beta`` (``routing.queue_score``). The same argument on
    virtual arrivals: if r' is served while r waits, ``beta * (t_r' + d_r') <= min(y_r, cap) +
    beta * (t_r + d_r)``, and ``d_r' >= 0``, ``d_r <= D`` give ``t_r' <= t_r + (min(y_r, cap) + fair_cap) /
    beta``. So fairness lengthens the bound by at most ``fair_cap / beta`` seconds (205 s at the defaults),
    for every policy built on this score, and not at all for tenant "" or a lone tenant (d = 0).
    """
    if aging_rate <= 0:
        raise ValueError("aging_rate must be > 0 (without aging, a long request can starve)")
    return float(max(0, min(size_tokens, cap))) + aging_rate * enqueued_unix


def wait_bound_s(size_tokens: int, aging_rate: float, cap: int, fair_cap: int = 0) -> float:
    """Seconds after its arrival beyond which no newcomer overtakes a request (see ``priority_score``);
    ``fair_cap``: the fairness term's cap when tenants share the engine."""
    return (max(0, min(size_tokens, cap)) + max(0, fair_cap)) / aging_rate


def fcfs_priority(size_tokens: int, enqueued_unix: float, aging_rate: float, cap: int) -> float:
    """FCFS: arrival time alone (the size is ignored; nothing can starve)."""
    return enqueued_unix
