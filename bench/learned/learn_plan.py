"""What the live learning loop runs on: the eval trace, the labelled held-out tasks and the training tasks.

NOTE(learn plan): three sets of HumanEval problems, pairwise disjoint, so that neither figure the loop
reports is measured on a task it learned from:

- the **eval trace**: the first ``--eval-tasks`` workflows of ``bench.live.run``'s trace (the same seeded
  held-out draw and Poisson offsets, so its figures sit beside ``real_live``'s), replayed before and after;
- the **mAP tasks**: every (problem, workflow) of ``bench/data/real`` run on every engine of the pool, with
  its real verified outcome on each (the committed dataset, 27 tasks on the 0.5B/1.5B pair), scored by
  the router the stack served before and after;
- the **training tasks**: the other HumanEval problems with a check, in a seeded order, served during the
  learning phase on every engine (each task pinned once to each model, so both models get labels).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bench.live.plan import held_out_problems
from services.collect.dataset import RunRecord
from services.common.types import OutcomeRow, TraceRow
from services.router.backends import RouterExample, router_examples
from services.workload.corpus import Problem

_TRAIN_SEED_SALT = 1_000_003  # the training draw must not be the eval draw's order under the same --seed


@dataclass(frozen=True, slots=True)
class TrainTask:
    index: int  # position in the training order: every engine serves the tasks in this order
    problem: Problem
    workflow: str


@dataclass(frozen=True, slots=True)
class TaskSplit:
    eval_trace: tuple[Problem, ...]
    map_tasks: tuple[tuple[str, str], ...]  # (problem id, workflow) labelled on every engine
    training: tuple[TrainTask, ...]

    def check_disjoint(self) -> None:
        """Raise when a training problem is an eval or mAP problem (the figures would be on seen tasks)."""
        train = {t.problem.id for t in self.training}
        seen = train & ({p.id for p in self.eval_trace} | {p for p, _ in self.map_tasks})
        if seen:
            raise ValueError(f"training tasks overlap the held-out ones: {sorted(seen)}")


def map_tasks(runs: Iterable[RunRecord], models: Sequence[str]) -> list[tuple[str, str]]:
    """(problem id, workflow) pairs of the dataset with a verified run on every one of ``models``."""
    on: dict[tuple[str, str], set[str]] = {}
    for r in runs:
        on.setdefault((r.problem_id, r.workflow), set()).add(r.model)
    return sorted(k for k, ms in on.items() if set(models) <= ms)


def map_examples(
    traces: Sequence[TraceRow],
    outcomes: Sequence[OutcomeRow],
    runs: Iterable[RunRecord],
    tasks: Sequence[tuple[str, str]],
) -> list[RouterExample]:
    """The router examples of ``tasks``: one per (task, model), the dataset's first run of it (a task run
    twice on one model would otherwise weigh double in that model's AP)."""
    task_of = {r.program_id: (r.problem_id, r.workflow) for r in runs}
    wanted = set(tasks)
    out: dict[tuple[str, str, str], RouterExample] = {}
    for e in router_examples(traces, outcomes):
        task = task_of.get(e.program_id)
        if task in wanted:
            assert task is not None
            out.setdefault((*task, e.model), e)
    return [out[k] for k in sorted(out)]


def training_tasks(
    corpus: Sequence[Problem],
    exclude: set[str],
    has_check: set[str],
    n: int,
    seed: int,
    workflows: Sequence[str],
) -> list[TrainTask]:
    """``n`` HumanEval problems outside ``exclude`` in a seeded order, the workflows taken in turn."""
    if not workflows:
        raise ValueError("no learning workflow given")
    drawn = held_out_problems(corpus, exclude, has_check, n, seed + _TRAIN_SEED_SALT)
    return [TrainTask(i, p, workflows[i % len(workflows)]) for i, p in enumerate(drawn)]


def split(
    corpus: Sequence[Problem],
    has_check: set[str],
    runs: Sequence[RunRecord],
    models: Sequence[str],
    eval_n: int,
    live_n: int,
    train_n: int,
    seed: int,
    workflows: Sequence[str],
) -> TaskSplit:
    """The three sets. ``live_n`` is ``bench.live.run``'s trace length: its whole draw is kept out of training
    (not only the ``eval_n`` replayed here), so a later ``bench.live.run`` run never meets a learned task."""
    in_data = {r.problem_id for r in runs}
    live = held_out_problems(corpus, in_data, has_check, max(live_n, eval_n), seed)
    exclude = in_data | {p.id for p in live}
    out = TaskSplit(
        eval_trace=tuple(live[:eval_n]),
        map_tasks=tuple(map_tasks(runs, models)),
        training=tuple(training_tasks(corpus, exclude, has_check, train_n, seed, workflows)),
    )
    out.check_disjoint()
    return out


def label_counts(outcomes: Iterable[OutcomeRow]) -> dict[str, dict[str, int]]:
    """Per model: the labels the loop collected and how many were successes (outcome >= 0.5)."""
    out: dict[str, dict[str, int]] = {}
    for o in outcomes:
        c = out.setdefault(o.model, {"labels": 0, "passed": 0})
        c["labels"] += 1
        c["passed"] += int(o.outcome >= 0.5)
    return dict(sorted(out.items()))
