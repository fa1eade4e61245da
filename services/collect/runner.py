"""``chimera collect``: the paper's workflows on each model of a real pool, through the live stack, verified.

One stack (``running_stack``: private Redis, router, predictor, one worker per engine, dispatcher) is
started on the selected engines of a pool. Each pending (engine, task) runs as the demo runs a workflow
(``services.demo.client.run_workflow``: every stage through the gRPC front door, the model pinned, the last
answer verified in the sandbox, the score sent with EndProgram), then the product's own export
(``services.jobs.export.export_traces``) copies the trace and outcome streams into ``<state>/export``
and ``publish`` folds that into the dataset folder. What the dataset already holds is skipped, so a killed
collection loses at most the workflows in flight and a rerun carries on.

The state folder keeps the private Redis (append-only file, with the export's cursors), the bootstrap
artifacts, each engine's measured profile and the logs, so a rerun starts faster and exports each row once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from chimera.dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc
from services.collect.dataset import RunRecord, append_run, publish
from services.collect.pinning import core_plan, pin_engines
from services.collect.plan import Task, collected, pending, program_id
from services.common.keys import Keys
from services.common.redis_client import connect_sync
from services.common.tracestore import read_trace_folder
from services.demo.client import WorkflowRun, run_workflow
from services.jobs.export import export_traces
from services.launcher.config import LauncherSettings
from services.launcher.pool import EngineSpec, PoolSpec
from services.launcher.stack import Stack, running_stack
from services.verify.answers import AnswerKey

log = logging.getLogger(__name__)
KEY_PREFIX = "collect"


@dataclass(frozen=True, slots=True)
class CollectPlan:
    out: Path  # the dataset folder (committed)
    state_dir: Path  # private Redis, artifacts, logs, raw export (not committed)
    max_tokens: int = 512  # per stage
    concurrency: int = 4  # workflows in flight per engine
    pin_cores: bool = True

    @property
    def raw(self) -> Path:
        return self.state_dir / "export"


def select_engines(pool: PoolSpec, wanted: Sequence[str]) -> PoolSpec:
    """The engines named (by id or model name), in the pool's order; all of them when none is named."""
    if not wanted:
        return pool
    chosen = tuple(e for e in pool.engines if e.id in wanted or e.model in wanted)
    unknown = set(wanted) - {e.id for e in chosen} - {e.model for e in chosen}
    if unknown:
        raise ValueError(f"not in the pool: {sorted(unknown)}; it has {[e.id for e in pool.engines]}")
    return PoolSpec(engines=chosen)


def _record(run: WorkflowRun, engine: EngineSpec, started: float, plan: CollectPlan) -> RunRecord:
    assert run.verdict is not None
    return RunRecord(
        program_id=run.program_id,
        engine=engine.id,
        model=engine.model,
        workflow=run.workflow.name,
        problem_id=run.problem.id,
        stages=len(run.stages),
        prompt_tokens=sum(s.prompt_tokens for s in run.stages),
        completion_tokens=sum(s.completion_tokens for s in run.stages),
        e2e_s=round(run.e2e_s, 3),
        check=run.verdict.kind,
        score=run.verdict.score,
        detail=run.verdict.detail,
        started_unix=round(started, 3),
        max_tokens=plan.max_tokens,
        concurrency=plan.concurrency,
    )


async def run_pending(
    dispatcher_addr: str,
    todo: Sequence[tuple[EngineSpec, Task]],
    key: AnswerKey,
    plan: CollectPlan,
    on_done: Callable[[WorkflowRun, EngineSpec, float], None],
) -> int:
    """Run ``todo``, ``plan.concurrency`` workflows at a time per engine; ``on_done`` gets each verified
    run (in a thread, one at a time). Returns how many were verified."""
    limits = {e.id: asyncio.Semaphore(plan.concurrency) for e, _ in todo}
    lock = asyncio.Lock()
    verified = 0
    async with grpc.aio.insecure_channel(dispatcher_addr) as channel:
        stub = pb_grpc.DispatcherStub(channel)

        async def one(engine: EngineSpec, task: Task) -> None:
            nonlocal verified
            async with limits[engine.id]:
                pid = program_id(task, engine.id, uuid.uuid4().hex[:8])
                run = WorkflowRun(pid, task.workflow, task.problem, model=engine.model)
                started = time.time()
                await run_workflow(stub, run, plan.max_tokens, key)
            if run.verdict is None:
                log.warning("%s on %s not verified: %s", task.key, engine.id, run.error or "no verdict")
                return
            async with lock:
                await asyncio.to_thread(on_done, run, engine, started)
                verified += 1

        await asyncio.gather(*(one(e, t) for e, t in todo))
    return verified


def _settings(plan: CollectPlan, pool_file: Path | None) -> LauncherSettings:
    # A private Redis in the state folder (never a shared one), free ports, a fixed key prefix so a rerun
    # finds its export cursors. Routing does not matter (every stage is pinned): small bootstrap artifacts.
    return LauncherSettings.ephemeral(
        plan.state_dir, key_prefix=KEY_PREFIX, pool_file=pool_file, start_timeout_s=1800.0
    )


def _worker_pids(stack: Stack) -> dict[str, int]:
    pids = {}
    for child in stack.supervisor.children:
        if child.name.startswith("worker-") and child.proc is not None:
            pids[child.name.removeprefix("worker-")] = child.proc.pid
    return pids


def collect(
    plan: CollectPlan,
    pool: PoolSpec,
    tasks: Sequence[Task],
    key: AnswerKey,
    pool_file: Path | None = None,
) -> dict[str, int]:
    """Collect every (engine, task) the dataset lacks; returns the dataset's counts."""
    counts = publish(plan.raw, plan.out)  # first fold in what a killed run exported
    done = collected(read_trace_folder(plan.out)[1])
    engines = {e.id: e for e in pool.engines}
    todo = [(engines[e], t) for e, t in pending(tasks, list(engines), done)]
    log.info(
        "%d tasks x %d engines: %d runs collected, %d to run", len(tasks), len(engines), len(done), len(todo)
    )
    if not todo:
        return counts
    with running_stack(_settings(plan, pool_file), pool) as stack:
        if plan.pin_cores:
            cores = sorted(os.sched_getaffinity(0))
            pin_engines(_worker_pids(stack), core_plan(list(engines), cores))
        r = connect_sync(stack.redis_url)
        keys = Keys(stack.key_prefix)

        def checkpoint() -> None:
            export_traces(r, keys, plan.raw, batch=500, lease_s=60.0)
            counts.update(publish(plan.raw, plan.out))

        def on_done(run: WorkflowRun, engine: EngineSpec, started: float) -> None:
            append_run(plan.raw, _record(run, engine, started, plan))
            checkpoint()
            log.info(
                "%s on %s: score %.0f, %d tokens, %.1f s (%d runs in the dataset)",
                run.problem.id,
                engine.id,
                run.verdict.score if run.verdict else -1,
                sum(s.completion_tokens for s in run.stages),
                run.e2e_s,
                counts["programs"],
            )

        t0 = time.monotonic()
        try:
            n = asyncio.run(run_pending(stack.dispatcher_addr, todo, key, plan, on_done))
        finally:
            checkpoint()
            r.close()
        log.info("collected %d runs in %.0f s; dataset %s", n, time.monotonic() - t0, counts)
    return counts
