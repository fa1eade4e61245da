"""MLFQ queue order: FastServe-style multi-level feedback queue by *attained service* (paper §8).

A workflow's level is set by the output tokens its earlier stages already received (program-level attained
service, as Autellix does). Levels and quanta: ``MLFQ_LEVEL_FLOORS`` = 0 | 256 | 1024 | 4096 tokens (x4
quanta: 256, 768, 3072, then the last level), FCFS within a level, and promotion by waiting time through
the same linear aging as Chimera's queue. Queues are non-preemptive (a stage, once running, finishes), as
every policy here: the engine's batch is not re-ordered.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from services.policy.aging import priority_score

MLFQ_LEVEL_FLOORS: tuple[int, ...] = (0, 256, 1024, 4096)


def mlfq_level(attained_tokens: int, floors: Sequence[int] = MLFQ_LEVEL_FLOORS) -> int:
    """The MLFQ level (0 = highest) of a job that has already received ``attained_tokens`` of service."""
    return max(0, bisect.bisect_right(list(floors), max(0, attained_tokens)) - 1)


def mlfq_priority(size_tokens: int, enqueued_unix: float, aging_rate: float, cap: int) -> float:
    """MLFQ queue score of a job with ``size_tokens`` of attained service: its level's floor, aged.

    Within a level every job has the same floor, so the order is FCFS; a job one level down sorts behind
    the level above until it has waited ``(floor_k - floor_{k-1}) / aging_rate`` seconds longer (promotion).
    """
    floor = MLFQ_LEVEL_FLOORS[mlfq_level(size_tokens)]
    return priority_score(floor, enqueued_unix, aging_rate, cap)
