"""Periodic re-queueing of requests whose worker died, run by the dispatcher as a safety net.

Workers reap their own engine too; the REAP script is idempotent, so running both is safe. The dispatcher's
copy matters when an engine's only worker is gone for good: its claims would otherwise never expire.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

from redis.asyncio import Redis
from redis.exceptions import RedisError

from services.common.queue import QueueStore

log = logging.getLogger(__name__)


async def reap_once(store: QueueStore, redis: Redis) -> dict[str, list[str]]:
    """Reap every registered engine once. Returns engine -> re-queued request ids (non-empty only)."""
    out: dict[str, list[str]] = {}
    for engine in sorted(cast(set[str], await redis.smembers(store.keys.engines()))):
        ids = await store.reap(engine)
        if ids:
            out[engine] = ids
    return out


async def reap_forever(store: QueueStore, redis: Redis, interval_s: float) -> None:
    """Reap every ``interval_s`` seconds until cancelled; Redis errors are logged and retried next round."""
    while True:
        try:
            for engine, ids in (await reap_once(store, redis)).items():
                log.warning("re-queued %d request(s) of engine %s whose lease expired", len(ids), engine)
        except (RedisError, OSError) as e:
            log.warning("reaper round failed: %r", e)
        await asyncio.sleep(interval_s)
