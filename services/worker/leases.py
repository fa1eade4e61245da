"""One round of each of the worker's lease chores, apart from the loops that repeat them (``worker.py``).

Each takes what it needs and returns nothing: a Redis error is logged and the next round tries again, as the
leases themselves bound what a missed round costs (NOTE(failure) in ``worker.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from redis.exceptions import RedisError

from services.common.queue import QueueStore
from services.worker.metrics import WorkerMetrics
from services.worker.options import Job

log = logging.getLogger(__name__)


async def renew(
    q: QueueStore,
    m: WorkerMetrics,
    engine_id: str,
    held: Mapping[str, Job],
    lease_s: float,
    abort: Callable[[Job], Awaitable[None]],
) -> None:
    """Extend the lease of every held claim; abort those whose lease is gone or whose client cancelled."""
    attempts = {rid: j.claimed.attempt for rid, j in held.items()}
    try:
        res = await q.renew(engine_id, attempts, lease_s)
    except RedisError as exc:
        log.warning("lease renewal failed (%s); retrying", exc)
        return
    for rid in res.lost:
        job = held.get(rid)
        if job is not None and not job.lost and not job.finishing:
            log.warning("request %s: lease lost (re-queued elsewhere); aborting", job.key)
            job.lost = True
            m.lease_lost()
            await abort(job)
    for rid in res.cancelled:
        job = held.get(rid)
        if job is not None and not job.cancel:
            log.info("request %s: cancelled by the client; aborting", job.key)
            job.cancel = True
            await abort(job)


async def reap(q: QueueStore, m: WorkerMetrics, engine_id: str) -> None:
    """Re-queue the engine's requests whose lease expired (any worker of the engine may do it)."""
    try:
        ids = await q.reap(engine_id)
    except RedisError as exc:
        log.warning("reap failed: %s", exc)
        return
    if ids:
        log.info("re-queued %d requests whose lease expired: %s", len(ids), ids[:10])
        m.requeued(len(ids))


async def hand_back(q: QueueStore, m: WorkerMetrics, engine_id: str, jobs: Sequence[Job]) -> None:
    """Return the claims of ``jobs`` to the queue now rather than leave them to expire (RETURN_CLAIMS)."""
    held = {j.request_id: (j.request_id, j.attempt, j.started) for j in jobs}
    try:
        ids = await q.return_claims(engine_id, list(held.values()))
    except RedisError as exc:
        n = len(held)
        log.warning("could not hand back %d claims (%s); they return when their leases expire", n, exc)
        return
    if held:
        log.info("handed back %d claims: %d re-queued, the rest ended", len(held), len(ids))
        m.requeued(len(ids))
