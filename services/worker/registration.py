"""How a worker announces its engine in Redis: the engine set and the engine's info hash, refreshed (and
re-created when missing) by every heartbeat, and marked dead when the engine dies."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.typing import EncodableT, FieldT

from services.common.keys import EngineField, EngineHealth, Keys, ProfileField
from services.common.redis_client import is_cluster
from services.common.startup import NoStartupReport, Phase, StartupSink
from services.common.types import EngineProfile
from services.worker.engine.base import Engine
from services.worker.profiling import ProfileProgress, quick_profile, store_profile

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


@dataclass(frozen=True, slots=True)
class Registration:
    """What a worker wrote for its engine at start; kept in memory so that a heartbeat can write it again
    (a Redis restarted without its data, a FLUSH) without measuring the profile a second time."""

    engine_id: str
    fields: Mapping[str, str]


def registration(
    engine_id: str, fields: Mapping[str, str | int | float], profile: EngineProfile | None
) -> Registration:
    """The engine's info fields: ``fields`` plus the profile's, leaving ``load`` to the queue scripts."""
    mapping = {k: str(v) for k, v in fields.items()}
    f = EngineField
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
    return Registration(engine_id, mapping)


async def register(redis: Redis, keys: Keys, reg: Registration) -> None:
    """Add the engine to the engine set and write its info hash (healthy, nothing running yet)."""
    mapping: dict[FieldT, EncodableT] = dict(reg.fields.items())
    f = EngineField
    mapping |= {
        f.HEARTBEAT_MS: str(int(time.time() * 1000)),
        f.RUNNING: "0",
        f.HELD: "0",
        f.HEALTH: EngineHealth.OK,
        f.HEALTH_REASON: "",
    }
    # On a cluster the two keys lie in different slots, which no transaction spans: the info hash goes
    # first, so that an engine in the set always has its info (readers find engines through the set).
    async with redis.pipeline(transaction=not is_cluster(redis)) as pipe:
        pipe.hset(keys.engine_info(reg.engine_id), mapping=mapping)
        pipe.sadd(keys.engines(), reg.engine_id)
        await pipe.execute()


async def heartbeat(
    redis: Redis, keys: Keys, reg: Registration, worker_id: str, running: int, held: int
) -> bool:
    """Refresh liveness, health and occupancy (``running`` in the engine, ``held`` claims: running plus
    prefetched), and register again if the registration is gone. True when it had to.

    One round trip while registered: SADD is idempotent (it says whether the engine was missing) and an
    info hash that lost its model lost the rest of the registration with it."""
    f = EngineField
    mapping: dict[FieldT, EncodableT] = {
        f.HEARTBEAT_MS: int(time.time() * 1000),
        f.RUNNING: running,
        f.HELD: held,
        f.WORKER_ID: worker_id,
        f.HEALTH: EngineHealth.OK,
    }
    info = keys.engine_info(reg.engine_id)
    async with redis.pipeline(transaction=False) as pipe:
        pipe.sadd(keys.engines(), reg.engine_id)
        pipe.hexists(info, f.MODEL)
        pipe.hset(info, mapping=mapping)
        added, had_model, _ = await pipe.execute()
    if added or not had_model:
        log.warning(
            "engine %s was not registered (Redis lost its data?): registering it again", reg.engine_id
        )
        again: dict[FieldT, EncodableT] = dict(reg.fields.items())
        await redis.hset(info, mapping=again | {f.HEALTH_REASON: ""})
        return True
    return False


async def mark_dead(redis: Redis, keys: Keys, engine_id: str, worker_id: str, reason: str) -> None:
    """Say the engine is dead in its heartbeat: ``health`` and its reason for the health probe, and a zero
    ``heartbeat_ms`` so that every reader of liveness (the dispatcher's routing) stops sending it work now
    rather than once the heartbeat is stale. The registration stays: the restarted worker refreshes it."""
    f = EngineField
    mapping: dict[FieldT, EncodableT] = {
        f.HEARTBEAT_MS: 0,
        f.HEALTH: EngineHealth.DEAD,
        f.HEALTH_REASON: reason[:500],
        f.WORKER_ID: worker_id,
        f.RUNNING: 0,
        f.HELD: 0,
    }
    await redis.hset(keys.engine_info(engine_id), mapping=mapping)


def _source(measured: EngineProfile | None, profile: EngineProfile | None) -> str:
    if measured is not None:
        return "measured" if measured.complete else "quick"
    return "engine" if profile else "none"


def with_profile(reg: Registration, profile: EngineProfile) -> Registration:
    """``reg`` with ``profile`` (the worker's whole curve replacing its quick one) in place of its own."""
    fields = dict(reg.fields)
    fields[EngineField.PROFILE_SOURCE] = _source(profile, profile)
    return registration(reg.engine_id, fields, profile)


async def publish_profile(redis: Redis, keys: Keys, reg: Registration) -> None:
    """Write the profile fields of ``reg`` into the engine's info hash: the load balancer prices the
    engine by them from its next decision on."""
    f = EngineField
    names = (f.DECODE_MS_PER_TOKEN, f.MAX_BATCH_SIZE, f.PROFILE, f.PROFILE_SOURCE)
    mapping: dict[FieldT, EncodableT] = {k: reg.fields[k] for k in names if k in reg.fields}
    await redis.hset(keys.engine_info(reg.engine_id), mapping=mapping)


def _profile_progress(startup: StartupSink) -> Callable[[ProfileProgress], None]:
    def report(p: ProfileProgress) -> None:
        detail = f"quick profile, batch {p.batch_size}: {p.step_ms:.0f} ms per step"
        startup.report(Phase.PROFILING, detail, p.done, p.total, "points")

    return report


async def announce(
    redis: Redis,
    keys: Keys,
    engine: Engine,
    engine_id: str,
    kind: str,
    worker_id: str,
    profile_on_start: bool,
    max_attempts: int,
    lease_s: float,
    startup: StartupSink | None = None,
) -> Registration:
    """Register the worker's engine with its profile: the stored measured one, else the engine's own, else
    (a real engine on its first start, with ``profile_on_start``) a quick one measured now and stored, which
    the worker completes later (``services.worker.refine``)."""
    measured = await stored_profile(redis, keys, engine_id)
    if measured is None and engine.profile() is None and profile_on_start:
        log.info("engine %s has no measured profile: a quick one before it takes work", engine_id)
        sink = startup or NoStartupReport()
        sink.report(Phase.PROFILING, "quick profile: warming up")
        measured = await quick_profile(engine, _profile_progress(sink))
        await store_profile(redis, keys, engine_id, measured)
    profile = measured or engine.profile()
    f = EngineField
    fields: dict[str, str | int | float] = {
        f.MODEL: engine.model,
        f.KIND: kind,
        f.MAX_NUM_SEQS: engine.max_num_seqs,
        f.TOOLS: int(bool(getattr(engine, "calls_tools", False))),
        f.WORKER_ID: worker_id,
        # "quick": measured at start on two batch sizes; the worker replaces it with the whole curve.
        f.PROFILE_SOURCE: _source(measured, profile),
        # A simulated engine runs time_scale times faster than its profile; readers of its timings
        # (benchmarks) multiply wall durations by it. Real engines run at 1.
        f.TIME_SCALE: float(getattr(engine, "time_scale", 1.0)),
        # Every reaper of this engine (the dispatcher's too) fails poison requests by this worker's limit.
        f.MAX_ATTEMPTS: max_attempts,
        # Every reaper tells a Redis stall from dead workers by it (queue_scripts.REAP).
        f.LEASE_MS: int(lease_s * 1000),
    }
    reg = registration(engine_id, fields, profile)
    await register(redis, keys, reg)
    return reg
