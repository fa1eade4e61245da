"""Drive concurrent multi-stage workflows through the Dispatcher front door, as an agent framework would.

Each workflow runs its stages in order, feeding every stage's answer into the next stage's messages
(``services.workload.workflows.stage_messages``), then verifies the last stage's answer when the answer key
has a check for its problem (HumanEval tests and LeetCode cases in the sandbox, numeric answers matched;
``services.verify``) and calls EndProgram with that score as the workflow's outcome: a real training label
for the router's retraining.
"""

from __future__ import annotations

import asyncio
import logging
import random
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from chimera.dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc
from services.sdk.errors import ChimeraError, from_rpc_error
from services.sdk.retry import RetryPolicy
from services.verify.answers import AnswerKey
from services.verify.checks import Verdict
from services.verify.verifier import verify_problem
from services.workload.corpus import Problem
from services.workload.workflows import WORKFLOWS, Workflow, stage_messages

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StageOutcome:
    stage: int
    model: str
    engine: str
    queue_wait_s: float
    e2e_s: float
    prompt_tokens: int
    completion_tokens: int
    predicted_tokens: int
    attempts: int
    text: str


@dataclass
class WorkflowRun:
    program_id: str
    workflow: Workflow
    problem: Problem
    stages: list[StageOutcome] = field(default_factory=list)
    e2e_s: float = 0.0  # the stages only, not the verification after them
    error: str | None = None
    verdict: Verdict | None = None  # None: not completed, or no check for this problem
    model: str = ""  # "" lets Chimera choose; a served model's name pins every stage to it

    @property
    def completed(self) -> bool:
        return self.error is None and len(self.stages) == self.workflow.n_stages


async def run_stage(
    stub: pb_grpc.DispatcherStub,
    run: WorkflowRun,
    stage: int,
    history: Sequence[str],
    max_tokens: int,
    retry: RetryPolicy = RetryPolicy(),
) -> StageOutcome:
    messages = stage_messages(run.workflow, stage, run.problem.text, history)
    req = pb.GenerateRequest(
        program_id=run.program_id,
        stage=stage,
        workflow=run.workflow.name,
        messages=[pb.ChatMessage(role=m.role, content=m.content) for m in messages],
        sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0),
        # Every try of the stage carries one id: a retry after a broken stream re-attaches to the request.
        request_id=f"{run.program_id}-s{stage}",
        model=run.model,
    )
    t0 = time.monotonic()
    final: pb.Completion | None = None
    # A first stage the pool is too full for is refused before it produces anything: come back when told.
    # A broken stream (UNAVAILABLE) is tried again and gets the same request's events from the start.
    async for attempt in retry.retrying():
        with attempt:
            try:
                async for resp in stub.Generate(req):
                    if resp.HasField("final"):
                        final = resp.final
            except grpc.aio.AioRpcError as e:
                raise from_rpc_error(e) from None
    if final is None:
        raise RuntimeError("stream ended without a final message")
    return StageOutcome(
        stage=stage,
        model=final.model,
        engine=final.engine,
        queue_wait_s=final.queue_wait_s,
        e2e_s=time.monotonic() - t0,
        prompt_tokens=final.usage.prompt_tokens,
        completion_tokens=final.usage.completion_tokens,
        predicted_tokens=final.predicted_tokens,
        attempts=final.attempts,
        text=final.text,
    )


async def _verify(run: WorkflowRun, key: AnswerKey) -> Verdict | None:
    """The last stage's answer checked in a thread (code checks start a sandboxed interpreter)."""
    try:
        return await asyncio.to_thread(verify_problem, key, run.problem.id, run.stages[-1].text)
    except (OSError, subprocess.SubprocessError) as exc:
        # A verifier that cannot run leaves the workflow unlabelled rather than labelled wrong.
        log.warning("verifying %s failed: %s", run.problem.id, exc)
        return None


async def run_workflow(
    stub: pb_grpc.DispatcherStub, run: WorkflowRun, max_tokens: int, key: AnswerKey | None = None
) -> WorkflowRun:
    t0 = time.monotonic()
    history: list[str] = []
    try:
        for stage in range(run.workflow.n_stages):
            out = await run_stage(stub, run, stage, history, max_tokens)
            run.stages.append(out)
            history.append(out.text)
        run.e2e_s = time.monotonic() - t0
        if key is not None and run.completed:
            run.verdict = await _verify(run, key)
    except ChimeraError as exc:
        run.error = str(exc)
    except RuntimeError as exc:
        run.error = str(exc)
    finally:
        end = pb.EndProgramRequest(program_id=run.program_id)
        if run.verdict is not None:
            end.outcome = run.verdict.score  # the verified score: the router's training label
        await stub.EndProgram(end)
    if not run.e2e_s:
        run.e2e_s = time.monotonic() - t0
    return run


def plan_runs(problems: Sequence[Problem], n: int, seed: int) -> list[WorkflowRun]:
    """``n`` workflows cycling through the six workflow types, each on a random problem of its domain."""
    rng = random.Random(seed)
    runs = []
    for i in range(n):
        wf = WORKFLOWS[i % len(WORKFLOWS)]
        pool = [p for p in problems if p.domain == wf.domain] or list(problems)
        runs.append(WorkflowRun(f"demo-{uuid.uuid4().hex[:12]}", wf, rng.choice(pool)))
    return runs


async def run_workflows(
    dispatcher_addr: str,
    runs: Sequence[WorkflowRun],
    concurrency: int,
    max_tokens: int,
    key: AnswerKey | None = None,
    on_done: Callable[[WorkflowRun], None] | None = None,
) -> list[WorkflowRun]:
    """Run ``runs``, ``concurrency`` at a time; with ``key``, each completed one is verified and its score
    sent with EndProgram. ``on_done`` hears of each as it finishes."""
    sem = asyncio.Semaphore(concurrency)
    async with grpc.aio.insecure_channel(dispatcher_addr) as channel:
        stub = pb_grpc.DispatcherStub(channel)

        async def one(run: WorkflowRun) -> WorkflowRun:
            async with sem:
                await run_workflow(stub, run, max_tokens, key)
            if on_done is not None:
                on_done(run)
            return run

        return list(await asyncio.gather(*(one(r) for r in runs)))


async def run_demo(
    dispatcher_addr: str,
    problems: Sequence[Problem],
    n: int,
    concurrency: int,
    max_tokens: int,
    seed: int,
    key: AnswerKey | None = None,
) -> list[WorkflowRun]:
    """``n`` workflows of every type (``plan_runs``), ``concurrency`` at a time (``run_workflows``)."""
    return await run_workflows(dispatcher_addr, plan_runs(problems, n, seed), concurrency, max_tokens, key)
