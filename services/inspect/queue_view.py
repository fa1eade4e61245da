"""``queue_view``: every engine's waiting requests in the order its workers will claim them.

NOTE(order): workers claim with ZPOPMIN on the engine's queue, so ZRANGE of the same sorted set (ascending
score, ties by request id) is exactly the serving order; nothing here re-sorts. The effective priority
shown is ``score - aging_rate * now``, which equals ``min(y, cap) - aging_rate * (now - t_enq)``: the
predicted work minus the aging credit earned while waiting (see ``services.policy.aging``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio import Redis

from services.common.keys import EngineField, Keys, ProgramField, RequestField
from services.common.snapshot import parse_engine
from services.common.tenant_ids import tenant_of
from services.policy.admission import work_s

R, P = RequestField, ProgramField
_REQ_FIELDS = (R.PAYLOAD, R.Y, R.Y90, R.T_ENQ, R.ATTEMPT, R.DECISION, R.PROGRAM_ID, R.WORKER, R.T_CLAIM)


@dataclass(frozen=True, slots=True)
class WaitingRequest:
    position: int  # 0 is served next
    request_id: str
    program_id: str
    tenant: str  # "" when the dispatcher runs open (services/dispatcher/tenancy.py)
    workflow: str
    stage: int
    predicted_tokens: int
    predicted_tokens_p90: int
    score: float
    age_s: float
    effective_priority: float
    attempt: int  # > 0: it ran before and was re-queued after its worker died


@dataclass(frozen=True, slots=True)
class RunningRequest:
    request_id: str
    program_id: str
    tenant: str
    workflow: str
    stage: int
    predicted_tokens: int
    worker: str
    attempt: int
    running_s: float
    lease_left_s: float


@dataclass(frozen=True, slots=True)
class EngineQueue:
    engine: str
    model: str
    alive: bool
    heartbeat_age_s: float | None
    load_tokens: int
    work_s: float  # the load priced by the engine's profile: what admission bounds (max_queue_s)
    waiting_total: int
    waiting: tuple[WaitingRequest, ...]  # the first ``limit`` of them
    running: tuple[RunningRequest, ...]


@dataclass(frozen=True, slots=True)
class ProgramEntry:
    program_id: str
    workflow: str
    engine: str
    model: str
    stage: int
    request_id: str
    age_s: float
    idle_s: float
    ttl_s: int


@dataclass(frozen=True, slots=True)
class QueueView:
    now: float
    engines: tuple[EngineQueue, ...]
    programs: tuple[ProgramEntry, ...]


def _float(raw: Any, default: float = 0.0) -> float:
    try:
        return float(raw) if raw is not None else default
    except ValueError:
        return default


def _payload(raw: Any) -> dict[str, Any]:
    try:
        out = json.loads(raw) if raw is not None else {}
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def _scored(raw: Any) -> list[tuple[str, float]]:
    return [(str(m), float(score)) for m, score in raw]


def effective_priority(score: float, aging_rate: float, now: float) -> float:
    """``y - beta * (now - t_enq)`` from the static score ``y + beta * t_enq`` (smaller is served first)."""
    return score - aging_rate * now


async def _request_rows(redis: Redis, keys: Keys, engine: str, ids: Sequence[str]) -> list[dict[str, Any]]:
    pipe = redis.pipeline(transaction=False)
    for rid in ids:
        pipe.hmget(keys.request(engine, rid), list(_REQ_FIELDS))
    rows = await pipe.execute()
    return [dict(zip(_REQ_FIELDS, row, strict=True)) for row in rows]


async def waiting_requests(
    redis: Redis,
    keys: Keys,
    engine: str,
    start: int,
    stop: int,
    now: float,
    default_aging_rate: float = 0.0,
) -> tuple[WaitingRequest, ...]:
    """Queue entries ``start..stop`` (inclusive, ZRANGE indices) in serving order."""
    entries = _scored(await redis.zrange(keys.queue(engine), start, stop, withscores=True))
    ids = [m for m, _ in entries]
    rows = await _request_rows(redis, keys, engine, ids)
    out = []
    for i, ((_, score), rid, row) in enumerate(zip(entries, ids, rows, strict=True)):
        payload, decision = _payload(row[R.PAYLOAD]), _payload(row[R.DECISION])
        aging = _float(decision.get("aging_rate"), default_aging_rate)
        t_enq = _float(row[R.T_ENQ], now)
        out.append(
            WaitingRequest(
                position=start + i,
                request_id=rid,
                program_id=(pid := str(row[R.PROGRAM_ID] or payload.get("program_id", ""))),
                tenant=tenant_of(pid),
                workflow=str(payload.get("workflow", "")),
                stage=int(payload.get("stage", 0)),
                predicted_tokens=int(_float(row[R.Y])),
                predicted_tokens_p90=int(_float(row[R.Y90])),
                score=score,
                age_s=max(0.0, now - t_enq),
                effective_priority=effective_priority(score, aging, now),
                attempt=int(_float(row[R.ATTEMPT])),
            )
        )
    return tuple(out)


async def _running(redis: Redis, keys: Keys, engine: str, now: float) -> tuple[RunningRequest, ...]:
    claims = _scored(await redis.zrange(keys.claims(engine), 0, -1, withscores=True))
    ids = [m for m, _ in claims]
    rows = await _request_rows(redis, keys, engine, ids)
    out = []
    for (_, lease_ms), rid, row in zip(claims, ids, rows, strict=True):
        payload = _payload(row[R.PAYLOAD])
        out.append(
            RunningRequest(
                request_id=rid,
                program_id=(pid := str(row[R.PROGRAM_ID] or payload.get("program_id", ""))),
                tenant=tenant_of(pid),
                workflow=str(payload.get("workflow", "")),
                stage=int(payload.get("stage", 0)),
                predicted_tokens=int(_float(row[R.Y])),
                worker=str(row[R.WORKER] or ""),
                attempt=int(_float(row[R.ATTEMPT])),
                running_s=max(0.0, now - _float(row[R.T_CLAIM], now)),
                lease_left_s=lease_ms / 1000.0 - now,
            )
        )
    return tuple(out)


async def engine_ids(redis: Redis, keys: Keys) -> list[str]:
    return sorted(cast(set[str], await redis.smembers(keys.engines())))


async def _engine(
    redis: Redis, keys: Keys, engine: str, now: float, limit: int, dead_after_s: float
) -> EngineQueue:
    info = cast(dict[str, str], await redis.hgetall(keys.engine_info(engine)))
    waiting_total = int(await redis.zcard(keys.queue(engine)))
    running = await _running(redis, keys, engine, now)
    snap = parse_engine(engine, info, waiting_total, len(running), now, dead_after_s)
    hb = info.get(EngineField.HEARTBEAT_MS)
    return EngineQueue(
        engine=engine,
        model=snap.model,
        alive=snap.alive,
        heartbeat_age_s=now - _float(hb) / 1000.0 if hb else None,
        load_tokens=snap.inflight_tokens,
        work_s=work_s(snap),
        waiting_total=waiting_total,
        waiting=await waiting_requests(redis, keys, engine, 0, limit - 1, now),
        running=running,
    )


async def programs(redis: Redis, keys: Keys, now: float, limit: int) -> tuple[ProgramEntry, ...]:
    """The program table (SCAN, so it never blocks Redis), oldest first."""
    names: list[str] = []
    async for k in redis.scan_iter(match=keys.program_pattern(), count=500):
        names.append(str(k))
        if len(names) >= limit:
            break
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(name)
        pipe.ttl(name)
    res = await pipe.execute()
    prefix = keys.program("")
    out = []
    for i, name in enumerate(names):
        h: dict[str, str] = res[2 * i]
        if not h:
            continue  # ended between SCAN and HGETALL
        out.append(
            ProgramEntry(
                program_id=name[len(prefix) :],
                workflow=h.get(P.WORKFLOW, ""),
                engine=h.get(P.ENGINE, ""),
                model=h.get(P.MODEL, ""),
                stage=int(_float(h.get(P.STAGE))),
                request_id=h.get(P.REQUEST_ID, ""),
                age_s=max(0.0, now - _float(h.get(P.CREATED), now)),
                idle_s=max(0.0, now - _float(h.get(P.UPDATED), now)),
                ttl_s=int(res[2 * i + 1]),
            )
        )
    return tuple(sorted(out, key=lambda p: (-p.age_s, p.program_id)))


async def queue_view(
    redis: Redis,
    keys: Keys,
    engine: str | None = None,
    *,
    limit: int = 50,
    program_limit: int = 200,
    dead_after_s: float = 15.0,
    now: float | None = None,
) -> QueueView:
    """Per engine (or just ``engine``): waiting requests in serving order, running requests, and the
    program table (only the programs on ``engine`` when one is given)."""
    t = time.time() if now is None else now
    names = [engine] if engine is not None else await engine_ids(redis, keys)
    engines = tuple([await _engine(redis, keys, e, t, limit, dead_after_s) for e in names])
    progs = await programs(redis, keys, t, program_limit) if program_limit else ()
    if engine is not None:
        progs = tuple(p for p in progs if p.engine == engine)
    return QueueView(now=t, engines=engines, programs=progs)
