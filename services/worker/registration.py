"""How a worker announces its engine in Redis: the engine set and the engine's info hash."""

from __future__ import annotations

import logging
import time

from redis.asyncio import Redis
from redis.typing import EncodableT, FieldT

from services.common.keys import EngineField, Keys, ProfileField
from services.common.types import EngineProfile
from services.worker.engine.base import Engine
from services.worker.profiling import profile_engine, store_profile

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


async def announce(
    redis: Redis,
    keys: Keys,
    engine: Engine,
    engine_id: str,
    kind: str,
    worker_id: str,
    profile_on_start: bool,
) -> None:
    """Register the worker's engine with its profile: the stored measured one, else the engine's own, else
    (a real engine on its first start, with ``profile_on_start``) one measured now and stored."""
    measured = await stored_profile(redis, keys, engine_id)
    if measured is None and engine.profile() is None and profile_on_start:
        log.info("engine %s has no measured profile: profiling it before it takes work", engine_id)
        measured = await profile_engine(engine)
        await store_profile(redis, keys, engine_id, measured)
    profile = measured or engine.profile()
    f = EngineField
    fields: dict[str, str | int | float] = {
        f.MODEL: engine.model,
        f.KIND: kind,
        f.MAX_NUM_SEQS: engine.max_num_seqs,
        f.WORKER_ID: worker_id,
        f.PROFILE_SOURCE: "measured" if measured else ("engine" if profile else "none"),
        # A simulated engine runs time_scale times faster than its profile; readers of its timings
        # (benchmarks) multiply wall durations by it. Real engines run at 1.
        f.TIME_SCALE: float(getattr(engine, "time_scale", 1.0)),
    }
    await register(redis, keys, engine_id, fields, profile)
