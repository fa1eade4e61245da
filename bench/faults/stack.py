"""One fault against one fresh stack: the pool, the run, and what Redis and the logs hold afterwards.

The stack is the one ``chimera up`` runs (``running_stack``: private redis-server, router, predictor, two
workers, dispatcher; two dispatchers on the one Redis for a kind that needs them), with SIMULATED engines,
a measuring instrument as in tests/test_e2e_stack.py: a small and a three times slower large engine, four
sequences each, a short worker lease so that a killed worker's claims come back within the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import redis

from bench.faults.count import WorkflowRecord, count
from bench.faults.drive import (
    DriveConfig,
    Inspect,
    Plan,
    Progress,
    run_workflow,
    time_to_serve,
    workflow_client,
)
from bench.faults.inject import CRASH_ENGINE, DIE_FILE, FAULTS, FaultEnv, Injection
from services.common.keys import Keys
from services.common.redis_client import connect_sync
from services.launcher.config import LauncherSettings
from services.launcher.pool import EngineSpec, PoolSpec
from services.launcher.stack import Stack, running_stack
from services.sdk.client import AsyncClient

PROFILE = {"decode_ms_per_token": 33.0, "max_batch_size": 4, "prefill_ms_per_token": 0.0}
STEPS = ((1, 33.0), (16, 51.6))


@dataclass(frozen=True, slots=True)
class StackConfig:
    # 2: a 64-token stage takes about 1.5 s on the small engine and 5 s on the large one, so a run of 16
    # workflows (one to four stages) lasts tens of seconds and a fault lands among running requests.
    time_scale: float = 2.0
    lease_s: float = 2.0
    max_num_seqs: int = 4
    restart_grace_s: float = 10.0


@dataclass(frozen=True, slots=True)
class RunConfig:
    workflows: int = 16
    seed: int = 20260401
    stack: StackConfig = StackConfig()
    drive: DriveConfig = DriveConfig()
    fault_at: float = 0.25  # strike once this share of all stages has been answered
    fault_latest_s: float = 30.0  # ... or after this long, whichever comes first
    workflow_budget_s: float = 240.0  # every workflow ends (answered, failed or hung) by then
    recovery_limit_s: float = 90.0
    drain_s: float = 30.0  # after the clients are done, how long the accounting may take to settle
    keep_state: bool = False


def pool(cfg: StackConfig, crash_file: Path | None = None) -> PoolSpec:
    def engine(eid: str, model: str, slow: float) -> EngineSpec:
        profile = {
            **PROFILE,
            "decode_ms_per_token": 33.0 * slow,
            "step_ms": [[b, t * slow] for b, t in STEPS],
        }
        env = {
            "time_scale": f"{cfg.time_scale:g}",
            "lease_s": f"{cfg.lease_s:g}",
            "profile_json": json.dumps(profile),
        }
        if crash_file is not None and eid == CRASH_ENGINE:
            env[DIE_FILE] = str(crash_file.resolve())
        return EngineSpec(id=eid, model=model, kind="simulated", max_num_seqs=cfg.max_num_seqs, env=env)

    return PoolSpec(
        engines=(
            engine("small", "Qwen/Qwen2.5-1.5B-Instruct", 1.0),
            engine("large", "Qwen/Qwen2.5-7B-Instruct", 3.0),
        )
    )


@contextlib.contextmanager
def fault_stack(
    state: Path, cfg: StackConfig, arm_crash: bool = False, dispatchers: int = 1
) -> Iterator[tuple[Stack, FaultEnv]]:
    settings = LauncherSettings.ephemeral(state, start_timeout_s=180, dispatchers=dispatchers)
    env: FaultEnv | None = None
    try:
        crash_file = state / "engine-crash.trigger" if arm_crash else None
        with running_stack(settings, pool(cfg, crash_file)) as stack:
            env = FaultEnv(stack, Keys(stack.key_prefix), restart_grace_s=cfg.restart_grace_s)
            env.crash_file = crash_file
            r = env.redis()
            try:
                r.set(marker(env.keys), "1")  # gone afterwards: Redis lost its data
            finally:
                r.close()
            try:
                yield stack, env
            finally:
                env.resume_all()
    finally:
        if env is not None:
            env.stop_own()


def marker(keys: Keys) -> str:
    return f"{keys.prefix}:bench:faults:marker"


RESIDUE_FIELDS = ("load", "inflight", "queue", "claims")


def residue(stack: Stack, keys: Keys) -> dict[str, int]:
    """Accounting left non-zero (what tests/test_e2e_stack.py asserts is zero after a run), plus requests
    still queued or running and program-table entries that EndProgram should have removed."""
    r = connect_sync(stack.redis_url, socket_timeout=5.0)
    try:
        out: dict[str, int] = {}
        for e in stack.pool.engines:
            out[f"{e.id}.load"] = int(float(r.hget(keys.engine_info(e.id), "load") or 0))
            out[f"{e.id}.inflight"] = int(r.hlen(keys.inflight(e.id)))
            out[f"{e.id}.queue"] = int(r.zcard(keys.queue(e.id)))
            out[f"{e.id}.claims"] = int(r.zcard(keys.claims(e.id)))
            open_ = 0
            for k in r.scan_iter(keys.request(e.id, "*"), count=500):
                open_ += r.hget(k, "state") in ("queued", "running")
            out[f"{e.id}.open_requests"] = open_
        # By who made them: the measured workflows, or the recovery probes.
        for k in r.scan_iter(keys.program_pattern(), count=500):
            who = "probe" if k.rsplit(":", 1)[-1].startswith("probe-") else "workflow"
            out[f"programs.{who}"] = out.get(f"programs.{who}", 0) + 1
        return {k: v for k, v in out.items() if v}
    finally:
        r.close()


def traced(stack: Stack, keys: Keys) -> dict[str, int] | None:
    """Trace rows per request id; None when Redis lost its data (the marker is gone)."""
    r = connect_sync(stack.redis_url, socket_timeout=5.0)
    try:
        if not r.exists(marker(keys)):
            return None
        rows: Counter[str] = Counter()
        for e in stack.pool.engines:
            for _sid, fields in r.xrange(keys.traces(e.id)) or ():
                rows[json.loads((fields or {})["row"])["request_id"]] += 1
        return dict(rows)
    finally:
        r.close()


_ERR = re.compile(r"\b(ERROR|CRITICAL|Traceback)\b")


def log_errors(stack: Stack) -> dict[str, int]:
    """ERROR lines and tracebacks per child log: where to look, not a verdict."""
    out = {}
    for c in stack.supervisor.children:
        with contextlib.suppress(OSError):
            n = sum(1 for line in c.log_path.read_text(errors="replace").splitlines() if _ERR.search(line))
            if n:
                out[c.name] = n
    return out


async def drain(stack: Stack, keys: Keys, limit_s: float) -> tuple[dict[str, int], float | None]:
    """Wait for the accounting to settle to zero; what is left and how long it took (None: never)."""
    t0 = time.monotonic()
    left: dict[str, int] = {}
    while True:
        with contextlib.suppress(redis.RedisError):
            left = await asyncio.to_thread(residue, stack, keys)
            if not left:
                return {}, round(time.monotonic() - t0, 2)
        if time.monotonic() - t0 > limit_s:
            return left, None
        await asyncio.sleep(0.5)


# A request hash's fields that say where it stands (not its prompt, request body or decision).
_STATE_FIELDS = (
    "state", "attempt", "worker", "deaths", "died_on", "cancel", "reattached", "score", "t_enq", "t_claim",
    "t_done", "sent",
)  # fmt: skip


def request_state(stack: Stack, keys: Keys, program_id: str, request_id: str) -> dict[str, Any]:
    """Where Redis has ``request_id`` on each engine: its hash's state fields, whether it sits in the queue
    or the claims, its output stream's length and last events, and its program's row. For a hung stage:
    which of them is missing says which hand-off lost it."""
    r = connect_sync(stack.redis_url, socket_timeout=5.0)
    try:
        out: dict[str, Any] = {}
        out["program"] = {k: v for k, v in r.hgetall(keys.program(program_id)).items() if k != "confidences"}
        for e in stack.pool.engines:
            fields = r.hmget(keys.request(e.id, request_id), _STATE_FIELDS)
            tail = r.xrevrange(keys.output(e.id, request_id), count=3) or []
            if not any(fields) and not tail:
                continue
            out[e.id] = {
                **{k: v for k, v in zip(_STATE_FIELDS, fields, strict=True) if v is not None},
                "queued": r.zscore(keys.queue(e.id), request_id),
                "claimed": r.zscore(keys.claims(e.id), request_id),
                "out_len": r.xlen(keys.output(e.id, request_id)),
                "out_last": [str((f or {}).get("ev", ""))[:80] for _sid, f in tail],
            }
        return out
    finally:
        r.close()


@dataclass
class Load:
    """Workflows in flight and their records, shared by the one-fault runs and the soak."""

    addr: str | Sequence[str]
    drive: DriveConfig
    progress: Progress = field(default_factory=Progress)
    records: list[WorkflowRecord] = field(default_factory=list)
    inspect: Inspect | None = None  # read a hung stage's request from Redis (request_state)

    async def one(self, client: AsyncClient, p: Plan, deadline: float) -> None:
        self.records.append(await run_workflow(client, p, self.drive, self.progress, deadline, self.inspect))


def watched_load(stack: Stack, env: FaultEnv, drive: DriveConfig) -> Load:
    """The load of a run on ``stack``: every door, and a hung stage's request read from Redis."""
    return Load(doors(stack), drive, inspect=partial(asyncio.to_thread, request_state, stack, env.keys))


def doors(stack: Stack) -> str | tuple[str, ...]:
    """What the clients are given: the one dispatcher, or every replica (the SDK uses them in turn)."""
    return stack.dispatcher_addrs if len(stack.dispatcher_addrs) > 1 else stack.dispatcher_addr


async def run_one_fault(
    stack: Stack, env: FaultEnv, kind: str, plans: list[Plan], cfg: RunConfig
) -> dict[str, Any]:
    load = watched_load(stack, env, cfg.drive)
    total = sum(p.workflow.n_stages for p in plans)
    t0 = time.monotonic()
    deadline = t0 + cfg.workflow_budget_s
    async with workflow_client(load.addr, cfg.drive) as client:
        tasks = [asyncio.create_task(load.one(client, p, deadline)) for p in plans]
        while load.progress.stages_done < total * cfg.fault_at and time.monotonic() - t0 < cfg.fault_latest_s:
            await asyncio.sleep(0.05)
        fault = asyncio.create_task(asyncio.to_thread(FAULTS[kind], env))
        before = asyncio.create_task(_stages_at_fault(env, load.progress))
        recovery = asyncio.create_task(
            time_to_serve(load.addr, cfg.drive, lambda: env.fired_at, cfg.recovery_limit_s)
        )
        await asyncio.gather(*tasks)
        injection = await _injection(fault, kind)
        stages_before = await before
        if not injection.injectable:
            recovery.cancel()
        recovery_s = await _settled(recovery)
    left, drained_s = await drain(stack, env.keys, cfg.drain_s)
    counts = count(load.records, await asyncio.to_thread(traced, stack, env.keys))
    return {
        "kind": kind,
        "injection": asdict(injection),
        "fault_after_s": round((env.fired_at or t0) - t0, 2),
        "stages_answered_before_fault": stages_before,
        "stages_planned": total,
        "counts": counts.as_dict(),
        "recovery_s": recovery_s,
        "residue": left,
        "drained_after_s": drained_s,
        "redis_data_survived": counts_traced_known(stack, env),
        "restarts": {c.name: c.restarts for c in stack.supervisor.children if c.restarts},
        "log_errors": log_errors(stack),
        "run_s": round(time.monotonic() - t0, 1),
        "stages": _stage_outcomes(load.records),
    }


def counts_traced_known(stack: Stack, env: FaultEnv) -> bool:
    with contextlib.suppress(redis.RedisError):
        r = env.redis()
        try:
            return bool(r.exists(marker(env.keys)))
        finally:
            r.close()
    return False


async def _stages_at_fault(env: FaultEnv, progress: Progress) -> int:
    while env.fired_at is None:
        await asyncio.sleep(0.02)
    return progress.stages_done


async def _injection(task: asyncio.Task[Injection], kind: str) -> Injection:
    try:
        return await task
    except Exception as exc:  # a fault that could not be applied is a row, not a crash of the run
        return Injection(kind, False, note=f"injection failed: {type(exc).__name__}: {exc}")


async def _settled(task: asyncio.Task[float | None]) -> float | None:
    try:
        return await task
    except asyncio.CancelledError:
        return None


def _stage_outcomes(records: list[WorkflowRecord]) -> list[dict[str, Any]]:
    """Per workflow, compactly: each stage's engine, attempts and error (the full texts stay out of the
    json: they are only needed for the counts, which are computed from them)."""
    return [
        {
            "program_id": w.program_id,
            "workflow": w.workflow,
            "stages": [
                {
                    "engine": s.engine,
                    "attempts": s.attempts,
                    "error": s.error_code or "",
                    "detail": s.error[:160],
                }
                for s in w.stages
            ],
        }
        for w in records
    ]
