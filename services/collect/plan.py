"""Which tasks a collection runs, how each run is named, and which runs a dataset already holds.

A task is one (workflow, problem) pair of a dataset source with a verifier. The plan is a fixed order per
source (a seeded shuffle of its checkable problems; each problem gets one of its domain's workflows in turn,
so every workflow and every stage count is covered), taken ``per_source`` deep and interleaved across the
sources: raising ``per_source`` only appends tasks, so a bigger collection extends a smaller one.

Every run of a task on an engine is a program whose id says what it was
(``real:<engine>:<workflow index>:<problem id>:<nonce>``), so the product's own outcome rows
(``OutcomeRow``: program id, workflow, model, engine, score) are enough to tell what is collected; the
nonce keeps a rerun after a crash from re-attaching to a stale request of the same name.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from services.common.types import OutcomeRow
from services.workload.corpus import Problem
from services.workload.workflows import WORKFLOWS, Workflow, workflows_for

PREFIX = "real"
CODE_SOURCES = ("humaneval", "leetcode")
MATH_SOURCES = ("champ", "euler", "gsm")
# The paper's two datasets (code, math), as the corpus sources that have a verifier (services/verify).
DEFAULT_SOURCES = CODE_SOURCES + MATH_SOURCES
# Sources whose problem texts may be committed: HumanEval is MIT (openai/human-eval). LeetCode, CHAMP,
# Project Euler and the GSM templates belong to their publishers: only ids, lengths and outcomes.
PUBLISHABLE_TEXT = frozenset({"humaneval"})


@dataclass(frozen=True, slots=True)
class Task:
    problem: Problem
    workflow: Workflow

    @property
    def key(self) -> tuple[str, str]:
        return (self.workflow.name, self.problem.id)


@dataclass(frozen=True, slots=True)
class RunId:
    """What a collection program id says."""

    engine: str
    workflow: str
    problem_id: str
    nonce: str

    @property
    def source(self) -> str:
        return self.problem_id.split("/", 1)[0]

    @property
    def task_key(self) -> tuple[str, str]:
        return (self.workflow, self.problem_id)


def plan_tasks(
    problems: Iterable[Problem],
    has_check: Callable[[str], bool],
    sources: Sequence[str],
    per_source: int,
    seed: int = 0,
) -> list[Task]:
    """The first ``per_source`` tasks of each source's fixed order, interleaved source by source."""
    pool = list(problems)
    columns: list[list[Task]] = []
    for source in sources:
        mine = sorted((p for p in pool if p.source == source and has_check(p.id)), key=lambda p: p.id)
        random.Random(f"{seed}/{source}").shuffle(mine)
        column = []
        for i, p in enumerate(mine[:per_source]):
            flows = workflows_for(p.domain)
            column.append(Task(p, flows[i % len(flows)]))
        columns.append(column)
    depth = max((len(c) for c in columns), default=0)
    return [c[i] for i in range(depth) for c in columns if i < len(c)]


def program_id(task: Task, engine: str, nonce: str) -> str:
    return f"{PREFIX}:{engine}:{WORKFLOWS.index(task.workflow)}:{task.problem.id}:{nonce}"


def parse_program_id(pid: str) -> RunId | None:
    """The run a collection program id names; None for any other program id."""
    head = pid.split(":", 3)
    if len(head) != 4 or head[0] != PREFIX or not head[2].isdigit():
        return None
    problem_id, sep, nonce = head[3].rpartition(":")
    index = int(head[2])
    if not sep or not problem_id or not nonce or index >= len(WORKFLOWS):
        return None
    return RunId(head[1], WORKFLOWS[index].name, problem_id, nonce)


def collected(outcomes: Iterable[OutcomeRow]) -> set[tuple[str, str, str]]:
    """(engine, workflow, problem id) of every collection run that has a verified outcome."""
    done = set()
    for row in outcomes:
        run = parse_program_id(row.program_id)
        if run is not None:
            done.add((run.engine, *run.task_key))
    return done


def pending(
    tasks: Sequence[Task], engines: Sequence[str], done: set[tuple[str, str, str]]
) -> list[tuple[str, Task]]:
    """(engine, task) pairs still to run, in plan order, engine by engine within each task."""
    return [(e, t) for t in tasks for e in engines if (e, *t.key) not in done]
