"""The learning phase: training workflows served through the live stack on every engine, each verified.

NOTE(learn serve): exploration is by pinning. Every engine works through the same training order (each
task pinned to that engine's model by the request's ``model`` field, as ``bench.live.run``'s alone runs do),
as many at once as the engine runs sequences, until the phase's time is up: a task is started only before the
deadline and is always finished, so no label is cut short. The 0.5B engine decodes about twice as fast as
the 1.5B one and so labels more tasks; the tasks both reached are labelled on both. A workflow runs as the
demo client runs it (``services.demo.client.run_workflow``: the gRPC front door, the answer verified in the
sandbox, the verified score sent with EndProgram), so the labels reach the outcome stream the product's
export reads, exactly as a framework's ``set_outcome`` would put them there.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import grpc

from bench.learned.learn_plan import TrainTask
from chimera.dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc
from services.demo.client import WorkflowRun, run_workflow
from services.verify.answers import AnswerKey
from services.workload.workflows import get_workflow

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LabelRecord:
    engine: str
    model: str
    task: int  # the training task's index
    problem_id: str
    workflow: str
    score: float | None  # the verified label sent with EndProgram; None: not completed or not checkable
    e2e_s: float
    completion_tokens: int
    error: str


async def _engine_labels(
    stub: pb_grpc.DispatcherStub,
    engine: str,
    model: str,
    tasks: Sequence[TrainTask],
    slots: int,
    deadline: float,
    max_tokens: int,
    key: AnswerKey,
) -> list[LabelRecord]:
    todo = iter(tasks)
    out: list[LabelRecord] = []

    async def slot() -> None:
        # A shared iterator: each slot takes the next task in the common order when its last one is done.
        while time.monotonic() < deadline:
            task = next(todo, None)
            if task is None:
                return
            run = WorkflowRun(
                f"learn-{engine}-{task.index}-{uuid.uuid4().hex[:6]}",
                get_workflow(task.workflow),
                task.problem,
                model=model,
            )
            await run_workflow(stub, run, max_tokens, key)
            score = None if run.verdict is None else run.verdict.score
            log.info(
                "learn %s #%d %s: score %s, %.1f s", engine, task.index, task.problem.id, score, run.e2e_s
            )
            out.append(
                LabelRecord(
                    engine=engine,
                    model=model,
                    task=task.index,
                    problem_id=task.problem.id,
                    workflow=task.workflow,
                    score=score,
                    e2e_s=round(run.e2e_s, 3),
                    completion_tokens=sum(s.completion_tokens for s in run.stages),
                    error=run.error or "",
                )
            )

    await asyncio.gather(*(slot() for _ in range(slots)))
    return sorted(out, key=lambda r: r.task)


async def serve_labels(
    addr: str,
    engines: Mapping[str, str],
    tasks: Sequence[TrainTask],
    slots: Mapping[str, int],
    learn_s: float,
    max_tokens: int,
    key: AnswerKey,
) -> list[LabelRecord]:
    """Every engine (id -> model) serves ``tasks`` in order with ``slots[engine]`` workflows in flight,
    starting new ones for ``learn_s`` seconds; the labels of all of them."""
    deadline = time.monotonic() + learn_s
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = pb_grpc.DispatcherStub(channel)
        per_engine = await asyncio.gather(
            *(
                _engine_labels(stub, e, m, tasks, slots[e], deadline, max_tokens, key)
                for e, m in engines.items()
            )
        )
    return [r for rows in per_engine for r in rows]
