"""The engine pool as every reader sees it: ``EngineSnapshot`` built from an engine's info hash and queues.

The dispatcher's policy, the metrics exporter and ``chimera queue`` all read engines through ``parse_engine``,
so an engine is alive, loaded and profiled the same way for all of them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from services.common.keys import EngineField, Keys
from services.common.types import EngineProfile, EngineSnapshot

log = logging.getLogger(__name__)


def parse_engine(
    engine_id: str, info: Mapping[str, str], queued: int, running: int, now_unix: float, dead_after_s: float
) -> EngineSnapshot:
    """Build a snapshot from an ``engine_info`` hash.

    An engine without a model or a usable profile is reported but marked dead: routing work to an engine
    whose speed is unknown would make its load meaningless. ``load`` is the in-flight predicted tokens the
    queue scripts maintain (the sum of the ``inflight`` hash).
    """
    f = EngineField
    model = info.get(f.MODEL, "")
    try:
        decode_ms = float(info.get(f.DECODE_MS_PER_TOKEN, "nan"))
        # Workers publish max_num_seqs; a measured max_batch_size, when present, is the better number.
        batch = int(float(info.get(f.MAX_BATCH_SIZE) or info.get(f.MAX_NUM_SEQS) or 0))
        heartbeat_ms = float(info.get(f.HEARTBEAT_MS, 0) or 0)
        load = int(float(info.get(f.LOAD, 0) or 0))
        drained = int(float(info.get(f.DRAINED, 0) or 0))
    except ValueError:
        log.warning("engine %s has an unreadable engine_info hash; treating it as dead", engine_id)
        decode_ms, batch, heartbeat_ms, load, drained = float("nan"), 0, 0.0, 0, 0
    usable = bool(model) and decode_ms == decode_ms and decode_ms > 0 and batch > 0
    alive = usable and (now_unix - heartbeat_ms / 1000.0) <= dead_after_s
    curve, prefill = _curve(engine_id, info.get(f.PROFILE)) if usable else ((), 0.0)
    profile = EngineProfile(
        decode_ms_per_token=decode_ms if usable else 0.0,
        max_batch_size=batch if usable else 1,
        prefill_ms_per_token=prefill,
        step_ms=curve,
    )
    return EngineSnapshot(
        engine_id=engine_id,
        model=model,
        profile=profile,
        inflight_tokens=max(0, load),
        queued=queued,
        running=running,
        alive=alive,
        drained_tokens=drained,
        calls_tools=info.get(f.TOOLS, "1") != "0",
    )


def _curve(engine_id: str, raw: str | None) -> tuple[tuple[tuple[int, float], ...], float]:
    """The step-time curve and prefill cost of the full profile the worker registered (field ``profile``).

    The paper's L[m] needs only the two flat fields, but a policy that prices batch size and prefill
    (chimera-plus) needs the curve: without it every engine would look as fast at 200 sequences as at one.
    An engine registered without one (an older worker) keeps the flat profile.
    """
    if not raw:
        return (), 0.0
    try:
        return _parsed_curve(raw)
    except (ValueError, TypeError, KeyError):
        log.warning("engine %s has an unreadable profile; using its flat decode cost", engine_id)
        return (), 0.0


@functools.lru_cache(maxsize=256)
def _parsed_curve(raw: str) -> tuple[tuple[tuple[int, float], ...], float]:
    # Every dispatch reads every engine's profile, which changes only when the engine is profiled again.
    full = EngineProfile.from_json(raw)
    return full.step_ms, full.prefill_ms_per_token


# What a snapshot needs of ``engine_info`` (not the whole hash: it also holds the worker's own fields).
_INFO = (
    EngineField.MODEL,
    EngineField.DECODE_MS_PER_TOKEN,
    EngineField.MAX_BATCH_SIZE,
    EngineField.MAX_NUM_SEQS,
    EngineField.HEARTBEAT_MS,
    EngineField.LOAD,
    EngineField.PROFILE,
    EngineField.DRAINED,
    EngineField.TOOLS,
)


def queue_engine_reads(pipe: Pipeline, keys: Keys, engine_ids: Sequence[str]) -> None:
    """Add the reads of ``engine_ids``' snapshots to ``pipe`` (three commands each, in order)."""
    for eid in engine_ids:
        pipe.hmget(keys.engine_info(eid), list(_INFO))
        pipe.zcard(keys.queue(eid))
        pipe.zcard(keys.claims(eid))


def engines_from(
    results: Sequence[Any], engine_ids: Sequence[str], now_unix: float, dead_after_s: float
) -> list[EngineSnapshot]:
    """The snapshots from the results of ``queue_engine_reads`` (the same ids, in the same order)."""
    out = []
    for i, eid in enumerate(engine_ids):
        values, queued, running = results[3 * i], results[3 * i + 1], results[3 * i + 2]
        info = {f: v for f, v in zip(_INFO, values, strict=True) if v is not None}
        out.append(parse_engine(eid, info, int(queued), int(running), now_unix, dead_after_s))
    return out


async def engine_ids(redis: Redis, keys: Keys) -> list[str]:
    """Every registered engine id, sorted. ``redis`` decodes responses (every client in Chimera does)."""
    return sorted(cast(set[str], await redis.smembers(keys.engines())))


async def read_engines(
    redis: Redis, keys: Keys, now_unix: float, dead_after_s: float
) -> list[EngineSnapshot]:
    """SMEMBERS engines, then each one's snapshot in one pipeline."""
    ids = await engine_ids(redis, keys)
    if not ids:
        return []
    pipe = redis.pipeline(transaction=False)
    queue_engine_reads(pipe, keys, ids)
    return engines_from(await pipe.execute(), ids, now_unix, dead_after_s)
