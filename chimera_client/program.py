"""One agent-framework run as one Chimera program, shared by the framework integrations.

A framework does not know about programs and stages: it runs a graph or an agent loop and calls a model
now and then. ``ProgramRun`` is the bridge: it names the run (program id, workflow), hands every model
call in it the next stage index, and keeps what each stage reported so that a caller can see which model
and engine Chimera chose and how long each stage waited.

The run in progress is found through a context variable rather than passed down, because the frameworks
call models several layers below the caller (LangGraph nodes, in worker threads or tasks that copy the
caller's context); a context variable follows those copies and keeps concurrent runs apart.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass

from chimera_client.types import Completion, Message

# The run the calling code is inside, if any (see the module docstring for why a context variable).
_CURRENT: ContextVar[ProgramRun | None] = ContextVar("chimera_program_run", default=None)

# The HTTP door's names for a workflow identity (services/dispatcher/http_input.py).
H_PROGRAM, H_STAGE, H_WORKFLOW = "X-Chimera-Program-Id", "X-Chimera-Stage", "X-Chimera-Workflow"
H_MODEL, H_ENGINE = "X-Chimera-Model", "X-Chimera-Engine"


@dataclass(frozen=True, slots=True)
class StageRecord:
    """What one model call of a run was served by."""

    stage: int
    model: str
    engine: str
    queue_wait_s: float | None  # None where the transport does not report it (streamed HTTP)
    completion_tokens: int | None = None

    @staticmethod
    def of(c: Completion, stage: int) -> StageRecord:
        return StageRecord(stage, c.model, c.engine, c.queue_wait_s, c.completion_tokens)


class ProgramRun:
    """A framework run as a program: its id, workflow name, stage counter, outcome and stage records.

    Thread-safe: a graph may run two nodes' model calls at once. Parallel calls get consecutive stages in
    the order they ask for one."""

    def __init__(self, workflow: str, program_id: str | None = None) -> None:
        self.workflow = workflow
        self.program_id = program_id or f"run-{uuid.uuid4().hex}"
        self.outcome: float | None = None
        self._lock = threading.Lock()
        self._next = 0
        self._records: list[StageRecord] = []

    def next_stage(self) -> int:
        with self._lock:
            stage, self._next = self._next, self._next + 1
            return stage

    def record(self, rec: StageRecord) -> None:
        with self._lock:
            self._records.append(rec)

    @property
    def stages(self) -> tuple[StageRecord, ...]:
        """Every stage reported so far, in stage order."""
        with self._lock:
            return tuple(sorted(self._records, key=lambda r: r.stage))

    def set_outcome(self, outcome: float) -> None:
        """The run's score in [0, 1], sent with EndProgram as a training label for the router."""
        if not 0.0 <= outcome <= 1.0:
            raise ValueError(f"outcome must be in [0, 1], got {outcome}")
        self.outcome = outcome

    def headers(self) -> dict[str, str]:
        """The HTTP door's identity headers. No stage: the door gives a program's call without one the
        program's next stage, so a call the HTTP client sends again after a refusal keeps its place."""
        return {H_PROGRAM: self.program_id, H_WORKFLOW: self.workflow}


def current_run() -> ProgramRun | None:
    """The run the caller is inside, or None."""
    return _CURRENT.get()


@contextmanager
def active(run: ProgramRun) -> Iterator[ProgramRun]:
    """Makes ``run`` the current run for the block (and for threads and tasks started from it)."""
    token = _CURRENT.set(run)
    try:
        yield run
    finally:
        # A generator holding the block may be closed from another context (an abandoned stream closed
        # at garbage collection), where the token cannot be reset; that context never had the run.
        with suppress(ValueError):
            _CURRENT.reset(token)


def chat_messages(system: str | None, turns: list[tuple[str, str]]) -> tuple[Message, ...]:
    """Chat messages in the three roles the dispatcher takes. Tool results and other roles become user
    turns, since the engines behind Chimera see plain chat."""
    out = [Message("system", system)] if system else []
    for role, text in turns:
        out.append(Message(role if role in ("system", "user", "assistant") else "user", text))
    return tuple(out)
