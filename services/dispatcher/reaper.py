"""Periodic re-queueing of requests whose worker died, run by one dispatcher replica as a safety net.

Workers reap their own engine too; the REAP script is idempotent, so running both is safe. The dispatcher's
copy matters when an engine's only worker is gone for good: its claims would otherwise never expire.

NOTE(lease): with several dispatcher replicas on one Redis, one of them reaps: the replica that holds
``Keys.reaper_lease`` (its name, ``redis-cli GET chimera:reaper:lease``). The holder extends it each round;
the lease outlives three rounds, so when the holder dies another replica takes over within that time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import cast

from redis.asyncio import Redis
from redis.exceptions import RedisError

from services.common.program_scripts import LEASE_HOLD, LEASE_RELEASE
from services.common.queue import QueueStore

log = logging.getLogger(__name__)

_LEASE_ROUNDS = 3


async def reap_once(store: QueueStore, redis: Redis) -> dict[str, list[str]]:
    """Reap every registered engine once. Returns engine -> re-queued request ids (non-empty only)."""
    out: dict[str, list[str]] = {}
    for engine in sorted(cast(set[str], await redis.smembers(store.keys.engines()))):
        ids = await store.reap(engine)
        if ids:
            out[engine] = ids
    return out


class ReaperLease:
    def __init__(self, redis: Redis, key: str, replica: str, lease_s: float) -> None:
        self._hold = redis.register_script(LEASE_HOLD)
        self._release = redis.register_script(LEASE_RELEASE)
        self._key, self.replica = key, replica
        self._lease_ms = max(1, int(lease_s * 1000))
        self.held = False

    async def hold(self) -> bool:
        """Take or extend the lease; whether this replica holds it now."""
        held = bool(await self._hold(keys=[self._key], args=[self.replica, self._lease_ms]))
        if held != self.held:
            log.info("replica %s %s the reaper", self.replica, "runs" if held else "no longer runs")
        self.held = held
        return held

    async def release(self) -> None:
        """Hand the lease back (a replica stopping), so that another takes it at its next round.

        Whether or not ``held`` says so: a stop that cancels ``hold`` after Redis ran it but before its
        reply was read leaves the lease taken and ``held`` False. The script deletes only this replica's
        lease, so asking is always safe."""
        await self._release(keys=[self._key], args=[self.replica])
        self.held = False


async def reap_forever(store: QueueStore, redis: Redis, interval_s: float, replica: str) -> None:
    """Reap every ``interval_s`` seconds while this replica holds the reaper lease, until cancelled; Redis
    errors are logged and retried next round."""
    lease = ReaperLease(redis, store.keys.reaper_lease(), replica, _LEASE_ROUNDS * interval_s)
    try:
        while True:
            try:
                if await lease.hold():
                    for engine, ids in (await reap_once(store, redis)).items():
                        log.warning("re-queued %d request(s) of engine %s (lease expired)", len(ids), engine)
            except (RedisError, OSError) as e:
                log.warning("reaper round failed: %r", e)
            await asyncio.sleep(interval_s)
    finally:
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            await asyncio.wait_for(lease.release(), 1.0)
