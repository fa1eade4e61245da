"""Fair shares across tenants in the queue order: a bounded, weighted penalty for holding too much of an
engine.

NOTE(fairness): what a tenant is charged for is its share of the engine's *workflow tokens*: the predicted
remaining tokens (ŷ) of its requests queued or running there, against the engine's total (the ``load`` the
policies already read). Its fair share is its weight over the weights of the tenants holding work on the
engine, with a tenant alone there counted beside one absent tenant of weight 1 (see NOTE(alone)). A tenant
at or under its fair share gets no penalty; above it, the penalty grows linearly to ``cap`` tokens when it
holds the whole engine:

    penalty = cap * clamp((share - fair) / (1 - fair), 0, 1)

The penalty is computed once, at enqueue, from the engine's state then (the queue score is static, see
``aging``), and enters the score as a later *virtual arrival*: ``routing.queue_score`` scores the request as
if it had arrived ``penalty / aging_rate`` seconds after it did. For Chimera's score that adds exactly
``penalty`` tokens; for FCFS and MLFQ it delays by the same seconds, so every policy gets the same meaning.

NOTE(alone): a score is static, so a penalty can only be given at enqueue. If a tenant alone on an engine
got none, the backlog it piles up while alone would keep its plain scores, and a second tenant arriving
later would wait behind all of it (aging serves older entries first). So a tenant alone is charged as if one
other tenant of weight 1 were there: its whole backlog carries the same full ``cap``, which changes nothing
in its own order (a constant shift), and a newcomer's first requests, charged nothing, go ahead of it.

What it keeps:

- **Tenant "" (no authentication):** no tenant accounting and no penalty: every score is the score without
  fairness (``tests/test_decisions_agree.py`` runs with tenant ""). **One named tenant alone:** every
  request gets the same ``cap``, a constant shift: the same order.
- **The order within a tenant:** two requests of one tenant enqueued at the same share get the same penalty,
  so their STJF order is unchanged; at different shares their scores differ by at most ``cap``.
- **The aging bound across tenants:** the virtual arrival is at most ``cap / aging_rate`` seconds late, so
  the bound of ``aging.priority_score`` grows by at most that much (the proof is there).

Why a share of the engine's tokens rather than of its requests: a workflow's cost is its tokens, and STJF
already orders by them; a tenant sending few huge workflows holds as much of the engine as one sending many
small ones. Why the engine's and not the pool's: each engine's queue is ordered on its own, and its
accounting lives in its own hash-tag slot (``queue_scripts`` keeps it): every script still touches one slot.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_WEIGHT = 1


@dataclass(frozen=True, slots=True)
class EngineShare:
    """What one engine holds, as the fairness term reads it (``EngineField`` tenant fields, or the ledger)."""

    load: int  # the engine's in-flight predicted tokens, every tenant's (and tenant "")
    own: int  # this tenant's part of ``load``
    own_weight: int  # the weight the engine holds for this tenant (0: it holds no work of it)
    weights: int  # the sum of the weights of the tenants holding work on the engine


def fair_share(weight: int, share: EngineShare) -> float:
    """The tenant's fair fraction of the engine: its weight over the active tenants' weights, itself counted
    once with its current ``weight``, and at least one other tenant of weight 1 (NOTE(alone))."""
    if weight < 1:
        raise ValueError("a tenant's weight must be >= 1")
    total = share.weights - share.own_weight + weight
    return weight / max(total, weight + DEFAULT_WEIGHT)


def fairness_tokens(weight: int, share: EngineShare, cap: int) -> float:
    """The penalty in tokens (0 to ``cap``) for a request of a tenant holding ``share`` of an engine.

    ``cap`` 0 turns fairness off. See the module's note for the rule and what it keeps.
    """
    if cap <= 0 or share.load <= 0 or share.own <= 0:
        return 0.0
    fair = fair_share(weight, share)
    held = min(1.0, share.own / share.load)
    return cap * min(1.0, max(0.0, (held - fair) / (1.0 - fair)))


def fairness_delay_s(tokens: float, aging_rate: float) -> float:
    """The penalty as a later virtual arrival: the seconds of aging credit it costs."""
    return tokens / aging_rate
