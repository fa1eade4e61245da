"""The fault benchmark's clients: multi-stage workflows through the SDK, every delta recorded; about half the
stages are streamed and the rest read whole (``DriveConfig.whole_percent``).

Each workflow runs its stages in order (every stage's answer feeds the next, as in ``services.demo``) and
records, per stage, every streamed delta with its attempt number, the final event, or the error it ended
with. A stage gets no retry beyond what the SDK itself does (``RetryPolicy``: a busy pool, and UNAVAILABLE
with the same request id, which re-attaches to the running request): the counts are what an SDK user sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.faults.count import HUNG, NO_FINAL, StageRecord, WorkflowRecord
from services.sdk.client import AsyncClient
from services.sdk.errors import ChimeraError
from services.sdk.retry import NO_RETRY, RetryPolicy
from services.sdk.types import Completion, Sampling, TextDelta
from services.workload.corpus import Problem
from services.workload.workflows import WORKFLOWS, Workflow, stage_messages


@dataclass(frozen=True, slots=True)
class DriveConfig:
    max_tokens: int = 64
    # A stage with no final event by then is hung: lost, not failed (no error ever told the client).
    stage_timeout_s: float = 90.0
    # The SDK's RetryPolicy budget (it retries a busy pool and a broken stream, re-attaching): what an
    # SDK user gets. It runs from a stage's first failure (NOTE(budget) in chimera_client/retry.py), so a
    # stage that breaks late and then keeps failing can outlast stage_timeout_s and count as hung.
    retry_budget_s: float = 60.0
    end_timeout_s: float = 10.0
    probe_tokens: int = 4
    probe_timeout_s: float = 20.0
    # Stages read whole (the SDK's final_only: the engine is not asked to stream), by a hash of the
    # stage's request id: the non-streaming path under the same faults.
    whole_percent: int = 50


@dataclass(frozen=True, slots=True)
class Plan:
    program_id: str
    workflow: Workflow
    problem: Problem


def plan(
    problems: Sequence[Problem], n: int, rng: random.Random, prefix: str = "flt", start: int = 0
) -> list[Plan]:
    """``n`` workflows cycling through the six types (1 to 4 stages) from ``start``, on random problems."""
    out = []
    for i in range(start, start + n):
        wf = WORKFLOWS[i % len(WORKFLOWS)]
        pool = [p for p in problems if p.domain == wf.domain] or list(problems)
        out.append(Plan(f"{prefix}-{uuid.UUID(int=rng.getrandbits(128)).hex[:12]}", wf, rng.choice(pool)))
    return out


def workflow_client(addr: str | Sequence[str], cfg: DriveConfig) -> AsyncClient:
    """The client the workflows share: the SDK's defaults but for the retry budget."""
    return AsyncClient(addr, retry=RetryPolicy(budget_s=cfg.retry_budget_s))


class Progress:
    """Stages answered so far, for the trigger that fires a fault mid-load."""

    def __init__(self) -> None:
        self.stages_done = 0
        self.workflows_done = 0


# What Redis holds for (program id, request id), read when a stage hangs (``faults_stack.request_state``).
Inspect = Callable[[str, str], Awaitable[Mapping[str, Any]]]


async def _stage(
    client: AsyncClient,
    p: Plan,
    stage: int,
    history: Sequence[str],
    cfg: DriveConfig,
    timeout_s: float,
    inspect: Inspect | None = None,
) -> StageRecord:
    msgs = [(m.role, m.content) for m in stage_messages(p.workflow, stage, p.problem.text, history)]
    rid = f"{p.program_id}-s{stage}"
    deltas: list[tuple[int, str]] = []
    final: Completion | None = None
    streamed = zlib.crc32(rid.encode()) % 100 >= cfg.whole_percent

    async def consume() -> None:
        nonlocal final
        # The SDK's own retries (a busy pool, a broken stream) re-attach with this one id per stage.
        async for ev in client.stream(
            msgs,
            program_id=p.program_id,
            stage=stage,
            workflow=p.workflow.name,
            sampling=Sampling(max_tokens=cfg.max_tokens),
            request_id=rid,
            final_only=not streamed,
        ):
            if isinstance(ev, TextDelta):
                deltas.append((ev.attempt, ev.text))
            else:
                final = ev

    code: str | None = None
    error = ""
    state: Mapping[str, Any] = {}
    started = time.monotonic()
    try:
        await asyncio.wait_for(consume(), timeout_s)
    except TimeoutError:
        code, error = HUNG, f"no final event after {timeout_s:.0f} s"
    except ChimeraError as exc:
        code, error = exc.code, exc.details
    except Exception as exc:  # anything else the client met is still a result to record
        code, error = type(exc).__name__, str(exc)
    seconds, ended_unix = round(time.monotonic() - started, 2), round(time.time(), 2)
    if code == HUNG and inspect is not None:  # now, before the request's retention or the drain clears it
        with contextlib.suppress(Exception):
            state = await inspect(p.program_id, rid)
    if code is None and final is None:
        code, error = NO_FINAL, "the stream ended without a final event"
    return StageRecord(
        stage=stage,
        request_ids=(rid,),
        deltas=tuple(deltas),
        final_text=final.text if final is not None else None,
        finish_reason=final.finish_reason if final is not None else "",
        attempts=final.attempts if final is not None else 0,
        engine=final.engine if final is not None else "",
        error_code=code,
        error=error[:300],
        redis_state=state,
        seconds=seconds,
        ended_unix=ended_unix,
        streamed=streamed,
    )


async def run_workflow(
    client: AsyncClient,
    p: Plan,
    cfg: DriveConfig,
    progress: Progress | None = None,
    deadline: float | None = None,
    inspect: Inspect | None = None,
) -> WorkflowRecord:
    """Run every stage; a stage still unanswered at ``deadline`` (monotonic) is hung, so a run always ends."""
    t0 = time.monotonic()
    stages: list[StageRecord] = []
    history: list[str] = []
    end_error = ""
    try:
        for i in range(p.workflow.n_stages):
            left = cfg.stage_timeout_s if deadline is None else deadline - time.monotonic()
            s = await _stage(client, p, i, history, cfg, max(0.1, min(cfg.stage_timeout_s, left)), inspect)
            stages.append(s)
            if s.error_code is not None or s.final_text is None:
                break
            history.append(s.final_text)
            if progress is not None:
                progress.stages_done += 1
    finally:
        # EndProgram's answer is not counted: the program table's residue after the drain says whether it
        # was lost. Shielded so that a harness timeout still ends the program.
        try:
            await asyncio.wait_for(asyncio.shield(client.end_program(p.program_id)), cfg.end_timeout_s)
        except Exception as exc:
            end_error = f"{type(exc).__name__}: {exc}"[:200]
        if progress is not None:
            progress.workflows_done += 1
    return WorkflowRecord(
        p.program_id, p.workflow.name, p.workflow.n_stages, tuple(stages), t0, time.monotonic(), end_error
    )


async def probe(addr: str | Sequence[str], cfg: DriveConfig) -> float | None:
    """One new one-stage workflow, one try, on a fresh channel (a channel that saw the door die may sit in
    gRPC's reconnect backoff, which would measure the client, not the server). When it was answered."""
    pid = f"probe-{uuid.uuid4().hex[:12]}"
    async with AsyncClient(addr, retry=NO_RETRY) as client:
        try:
            c = await client.generate(
                f"probe {pid}",
                program_id=pid,
                stage=0,
                workflow=WORKFLOWS[2].name,
                sampling=Sampling(max_tokens=cfg.probe_tokens),
                timeout_s=cfg.probe_timeout_s,
            )
            return time.monotonic() if c.text and c.finish_reason != "cancelled" else None
        except Exception:
            return None
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.end_program(pid), cfg.end_timeout_s)


async def time_to_serve(
    addr: str | Sequence[str],
    cfg: DriveConfig,
    fired_at: Callable[[], float | None],
    limit_s: float,
    every_s: float = 0.5,
) -> float | None:
    """Seconds from the fault until a probe started after it is answered; None if none is within
    ``limit_s``. Probes start every ``every_s`` and overlap, so one stuck probe does not hide recovery;
    those still out are waited for, not cancelled (a cancelled one would leave its program behind)."""
    while fired_at() is None:
        await asyncio.sleep(0.02)
    t_fault = fired_at()
    assert t_fault is not None
    answered: list[float] = []
    tasks: list[asyncio.Task[None]] = []

    async def one() -> None:
        t = await probe(addr, cfg)
        if t is not None:
            answered.append(t)

    while not answered and time.monotonic() - t_fault < limit_s:
        tasks.append(asyncio.create_task(one()))
        tick = time.monotonic() + every_s  # a door that refuses at once must not be probed in a tight loop
        while not answered and (left := tick - time.monotonic()) > 0:
            pending = [t for t in tasks if not t.done()]
            if not pending:
                await asyncio.sleep(left)
                break
            await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
    await asyncio.gather(*tasks, return_exceptions=True)
    return round(min(answered) - t_fault, 2) if answered else None
