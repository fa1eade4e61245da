"""The live side of ``bench.live.run``: one policy replays the trace through a fresh stack on the real
engines.

NOTE(live run): each policy gets its own ``running_stack`` (private Redis, router, predictor, one vLLM worker
per engine, the dispatcher with that policy), as ``bench.sweep.replay`` does. A fresh stack per policy costs
an engine start each time, but vLLM's prefix cache would otherwise hold the trace's prompts after the first
policy and flatter every later one. The stacks share one private Redis (``private_redis``) but each uses
its own key prefix, so no queue, load or program of an earlier (or killed) policy run reaches the next;
each engine's profile is measured once, before the first policy, by its worker in a stack of that
engine alone with the whole run pinned to the core the engine gets later (``profile_alone``), kept in the
state folder (``profiles.json``) and stored under every policy's prefix before the workers start, so every
policy (and the simulator) runs on the one measurement. Profiling both engines at once, as a two-engine
stack's workers do on their first start, measured each while the other loaded the machine: the 0.5B
engine's batched step came out 1.4 times its alone figure and the simulator's latencies for it twice the
live ones (an earlier 12-task run at 0.07/s). The state folder also keeps the router and predictor trained
on ``bench/data/real`` and the logs.
Each engine's worker is pinned to its own core after start (``services.collect.pinning``, as the
collector does), so one engine's load does not slow the other. The admission bound is off
(``max_queue_s`` 0): every workflow is served, as in the simulator, so the policies differ in routing
and queue order only. Stages run as the demo client runs them (``run_stage``: the gRPC front door, the
stage's answer in the next stage's messages); the last answer is verified in the sandbox and the score sent
with EndProgram. E2E is the first stage sent to the last stage answered; verification is not in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from bench.live.plan import WORKFLOW
from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from chimera.dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc
from services.collect.pinning import core_plan, pin_engines
from services.common.keys import EngineField, Keys
from services.common.redis_client import connect_sync, connect_tool
from services.common.redis_proc import PrivateRedisSpec
from services.common.tracestore import read_trace_folder
from services.common.types import EngineProfile
from services.demo.client import WorkflowRun, run_stage
from services.launcher.config import LauncherSettings
from services.launcher.pool import PoolSpec
from services.launcher.stack import Stack, running_stack
from services.launcher.supervisor import Child, Supervisor
from services.predictor.training import train_predictor
from services.router.training import train_router
from services.sdk.errors import ChimeraError
from services.verify.answers import AnswerKey
from services.verify.verifier import verify_problem
from services.worker.profiling import store_profile
from services.workload.corpus import Problem
from services.workload.workflows import get_workflow

log = logging.getLogger(__name__)
KEY_PREFIX = "live"
TRAINED_MARK = "trained_from.txt"
PROFILES = "profiles.json"


@dataclass(frozen=True, slots=True)
class StageRecord:
    engine: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    predicted_tokens: int  # the dispatcher's ŷ for this stage: median remaining workflow tokens
    queue_wait_s: float
    e2e_s: float


@dataclass(frozen=True, slots=True)
class WorkflowRecord:
    index: int  # position in the trace
    problem_id: str
    pinned: str  # the model the request named; "" when the policy chose
    arrival_s: float  # planned offset in the trace
    sent_s: float  # when its first stage was actually sent, from the replay's start
    e2e_s: float
    score: float | None  # verified score; None when it did not complete or could not be verified
    detail: str
    error: str
    stages: tuple[StageRecord, ...]

    @property
    def model(self) -> str:
        return self.stages[-1].model if self.stages else ""


@dataclass(frozen=True, slots=True)
class PolicyRun:
    policy: str
    started_unix: float
    wall_s: float  # first arrival to last workflow done
    workflows: tuple[WorkflowRecord, ...]
    profiles: Mapping[str, str]  # engine id -> its measured EngineProfile JSON, as the dispatcher read it
    pinned_threads: Mapping[str, int]  # engine id -> threads pinned to its core


@dataclass(frozen=True, slots=True)
class LiveSetup:
    state_dir: Path
    pool_file: Path
    pool: PoolSpec
    data: Path  # the training dataset (bench/data/real)
    max_tokens: tuple[int, ...]  # per stage; the last repeats
    pin_cores: bool = True

    def cap(self, stage: int) -> int:
        return self.max_tokens[min(stage, len(self.max_tokens) - 1)]


def train_models(data: Path, root: Path, stamp: str) -> None:
    """Router and predictor fitted on all of ``data`` with the product's training functions (the defaults
    ``chimera train --traces`` uses, no internal holdout: the live tasks are the held-out set). Skipped when
    ``root`` already holds models trained from the same ``stamp`` (the dataset's commit and row counts)."""
    mark = root / TRAINED_MARK
    if mark.exists() and mark.read_text() == stamp:
        return
    traces, outcomes = read_trace_folder(data)
    router = train_router(traces, outcomes, root, holdout=0.0)
    predictor = train_predictor(traces, root, holdout=0.0)
    log.info("trained on %s: router %s, predictor %s", data, router.version, predictor.version)
    root.mkdir(parents=True, exist_ok=True)
    mark.write_text(stamp)


def worker_pids(stack: Stack) -> dict[str, int]:
    return {
        c.name.removeprefix("worker-"): c.proc.pid
        for c in stack.supervisor.children
        if c.name.startswith("worker-") and c.proc is not None
    }


def _profiles(stack: Stack) -> dict[str, str]:
    """Each engine's profile as its worker registered it (what the dispatcher reads)."""
    r = connect_sync(stack.redis_url)
    try:
        keys = Keys(stack.key_prefix)
        return {
            e.id: str(r.hget(keys.engine_info(e.id), EngineField.PROFILE) or "") for e in stack.pool.engines
        }
    finally:
        r.close()


@contextlib.contextmanager
def private_redis(state: Path) -> Iterator[str]:
    """One private redis-server for every policy's stack (as ``running_stack`` starts its own); its URL."""
    state = state.resolve()  # redis-server changes into --dir: a relative socket path would not bind
    spec = PrivateRedisSpec(state / "redis")
    spec.prepare()
    sup = Supervisor()
    child = sup.add(Child("redis", spec.argv(), {}, state / "logs" / "redis.log", spec.responds))
    try:
        sup.start_and_wait([child], 60.0)
        yield spec.url
    finally:
        sup.stop_all()


def preload_profiles(redis_url: str, prefix: str, state: Path) -> None:
    """Store the profiles measured on the first start under ``prefix``: the workers read them and skip
    profiling."""
    path = state / PROFILES
    if not path.exists():
        return
    saved = {e: EngineProfile.from_json(j) for e, j in json.loads(path.read_text()).items() if j}

    async def store() -> None:
        client = connect_tool(redis_url)
        try:
            for engine, profile in saved.items():
                await store_profile(client, Keys(prefix), engine, profile)
        finally:
            await client.aclose()

    asyncio.run(store())


def profile_alone(setup: LiveSetup, redis_url: str) -> dict[str, str]:
    """Each engine's profile, measured by its own worker in a stack holding that engine only, every process
    of it pinned to the core the engine is pinned to in the policy runs; kept in ``profiles.json`` and
    read back from there on later runs."""
    path = setup.state_dir / PROFILES
    if path.exists():
        stored: dict[str, str] = json.loads(path.read_text())
        return stored
    cores = sorted(os.sched_getaffinity(0))
    plan = core_plan([e.id for e in setup.pool.engines], cores)
    profiles: dict[str, str] = {}
    for engine in setup.pool.engines:
        alone = PoolSpec(engines=(engine,))
        settings = LauncherSettings.ephemeral(
            setup.state_dir,
            redis_url=redis_url,
            key_prefix=f"{KEY_PREFIX}profile{uuid.uuid4().hex[:8]}",
            pool_file=setup.pool_file,
            start_timeout_s=1800.0,
            real_traces=None,  # the run's own artifacts serve (see serving_stack)
        )
        # Children inherit the affinity: the worker (and the engine process it spawns) profile on the
        # engine's own core, as they will run; router, predictor and dispatcher sit idle meanwhile.
        os.sched_setaffinity(0, plan[engine.id] if setup.pin_cores else set(cores))
        try:
            with running_stack(settings, alone) as stack:
                profiles[engine.id] = _profiles(stack)[engine.id]
        finally:
            os.sched_setaffinity(0, cores)
        log.info("profile of %s alone on cores %s: %s", engine.id, plan[engine.id], profiles[engine.id])
    if not all(profiles.values()):
        raise RuntimeError(f"a worker registered no profile: {profiles}")
    path.write_text(json.dumps(profiles, indent=1) + "\n")
    return profiles


async def _one(
    stub: pb_grpc.DispatcherStub,
    setup: LiveSetup,
    key: AnswerKey,
    tag: str,
    index: int,
    problem: Problem,
    pin: str,
    arrival_s: float,
    t0: float,
) -> WorkflowRecord:
    await asyncio.sleep(max(0.0, t0 + arrival_s - time.monotonic()))
    sent = time.monotonic()
    run = WorkflowRun(
        f"live-{tag}-{index}-{uuid.uuid4().hex[:6]}", get_workflow(WORKFLOW), problem, model=pin
    )
    history: list[str] = []
    error = ""
    try:
        for k in range(run.workflow.n_stages):
            out = await run_stage(stub, run, k, history, setup.cap(k))
            run.stages.append(out)
            history.append(out.text)
    except (ChimeraError, RuntimeError) as exc:
        error = str(exc)
    e2e = time.monotonic() - sent
    verdict = None
    if not error:
        verdict = await asyncio.to_thread(verify_problem, key, problem.id, run.stages[-1].text)
    end = pb.EndProgramRequest(program_id=run.program_id)
    if verdict is not None:
        end.outcome = verdict.score  # the verified label, as the demo client sends it
    await stub.EndProgram(end)
    log.info(
        "%s #%d %s on %s: score %s, %.1f s",
        tag,
        index,
        problem.id,
        run.stages[-1].engine if run.stages else "-",
        verdict.score if verdict else None,
        e2e,
    )
    return WorkflowRecord(
        index=index,
        problem_id=problem.id,
        pinned=pin,
        arrival_s=arrival_s,
        sent_s=round(sent - t0, 3),
        e2e_s=round(e2e, 3),
        score=None if verdict is None else verdict.score,
        detail="" if verdict is None else verdict.detail,
        error=error,
        stages=tuple(
            StageRecord(
                s.engine,
                s.model,
                s.prompt_tokens,
                s.completion_tokens,
                s.predicted_tokens,
                round(s.queue_wait_s, 3),
                round(s.e2e_s, 3),
            )
            for s in run.stages
        ),
    )


async def _drive(
    addr: str,
    setup: LiveSetup,
    key: AnswerKey,
    tag: str,
    problems: Sequence[Problem],
    pins: Sequence[str],
    offsets: Sequence[float],
) -> list[WorkflowRecord]:
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = pb_grpc.DispatcherStub(channel)
        t0 = time.monotonic()
        jobs = [
            _one(stub, setup, key, tag, i, p, pin, at, t0)
            for i, (p, pin, at) in enumerate(zip(problems, pins, offsets, strict=True))
        ]
        return list(await asyncio.gather(*jobs))


@contextlib.contextmanager
def serving_stack(
    setup: LiveSetup, redis_url: str, prefix: str, dispatcher_env: Mapping[str, str]
) -> Iterator[tuple[Stack, dict[str, int]]]:
    """A stack on ``redis_url`` under ``prefix`` with the run's measured profiles, each engine's worker
    pinned to its core as ``bench.live.run``'s policy runs are; yields it and the threads pinned per
    engine."""
    settings = LauncherSettings.ephemeral(
        setup.state_dir,
        redis_url=redis_url,
        key_prefix=prefix,
        pool_file=setup.pool_file,
        start_timeout_s=1800.0,
        # The artifacts in the state folder are the run's own (trained or bootstrapped by the benchmark);
        # the launcher must not retrain them from the committed real traces.
        real_traces=None,
    )
    preload_profiles(redis_url, prefix, setup.state_dir)
    # The admission bound off, as in the eval passes: a pinned first stage is never refused or browned out.
    env = {**dispatcher_env, "CHIMERA_DISPATCHER_MAX_QUEUE_S": "0"}
    with running_stack(settings, setup.pool, dispatcher_env=env) as stack:
        pinned: dict[str, int] = {}
        if setup.pin_cores:
            engines = [e.id for e in setup.pool.engines]
            pinned = pin_engines(worker_pids(stack), core_plan(engines, sorted(os.sched_getaffinity(0))))
        yield stack, pinned


def run_policy(
    setup: LiveSetup,
    name: str,
    dispatcher_env: Mapping[str, str],
    problems: Sequence[Problem],
    pins: Sequence[str],
    offsets: Sequence[float],
    key: AnswerKey,
    redis_url: str,
) -> PolicyRun:
    """One policy's replay of the trace on a fresh stack (on ``redis_url``, a key prefix of its own); the
    stack is stopped before this returns."""
    prefix = f"{KEY_PREFIX}{uuid.uuid4().hex[:8]}"
    started = time.time()
    with serving_stack(setup, redis_url, prefix, dispatcher_env) as (stack, pinned):
        profiles = _profiles(stack)
        t0 = time.monotonic()
        rows = asyncio.run(_drive(stack.dispatcher_addr, setup, key, name, problems, pins, offsets))
        wall = time.monotonic() - t0
    return PolicyRun(name, round(started, 3), round(wall, 3), tuple(rows), profiles, pinned)
