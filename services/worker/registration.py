"""How a worker announces its engine in Redis: the engine set and the engine's info hash."""

from __future__ import annotations

import logging
import time

from redis.asyncio import Redis
from redis.typing import EncodableT, FieldT

from services.common.keys import EngineField, Keys, ProfileField
from services.common.types import EngineProfile

log = logging.getLogger(__name__)


async def stored_profile(redis: Redis, keys: Keys, engine_id: str) -> EngineProfile | None:
    """The profile ``chimera profile`` measured for this engine (field ``json`` of its profile hash)."""
    raw = await redis.hget(keys.profile(engine_id), ProfileField.JSON)
    if not raw:
        return None
    try:
        return EngineProfile.from_json(raw)
    except (ValueError, TypeError, KeyError):
        log.warning("ignoring the unreadable stored profile of engine %s: %r", engine_id, raw)
        return None


async def register(
    redis: Redis,
    keys: Keys,
    engine_id: str,
    fields: dict[str, str | int | float],
    profile: EngineProfile | None,
) -> None:
    """Add the engine to the engine set and write its info hash, leaving ``load`` to the queue scripts."""
    mapping: dict[FieldT, EncodableT] = {k: str(v) for k, v in fields.items()}
    f = EngineField
    mapping |= {f.HEARTBEAT_MS: str(int(time.time() * 1000)), f.RUNNING: "0", f.HELD: "0"}
    if profile is not None:
        mapping |= {
            f.DECODE_MS_PER_TOKEN: repr(profile.decode_ms_per_token),
            f.MAX_BATCH_SIZE: str(profile.max_batch_size),
            f.PROFILE: profile.to_json(),
        }
    else:
        log.warning(
            "engine %s has no profile yet: the load balancer cannot weigh it until one is measured", engine_id
        )
    async with redis.pipeline(transaction=True) as pipe:
        pipe.sadd(keys.engines(), engine_id)
        pipe.hset(keys.engine_info(engine_id), mapping=mapping)
        await pipe.execute()


async def heartbeat(
    redis: Redis, keys: Keys, engine_id: str, worker_id: str, running: int, held: int
) -> None:
    """Refresh liveness and occupancy: ``running`` in the engine, ``held`` claims (running + prefetched)."""
    mapping: dict[FieldT, EncodableT] = {
        EngineField.HEARTBEAT_MS: int(time.time() * 1000),
        EngineField.RUNNING: running,
        EngineField.HELD: held,
        EngineField.WORKER_ID: worker_id,
    }
    await redis.hset(keys.engine_info(engine_id), mapping=mapping)
