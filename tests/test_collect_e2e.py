"""``chimera collect``'s path through the real stack, on SIMULATED engines (the product's measuring
instrument: no model weights) and FAKE problems with a fake HumanEval-style check: the workflows go through
the front door pinned to each engine, are verified in the sandbox, leave their outcome with EndProgram, and
come out of the product's export into the dataset; a rerun runs nothing and starts no stack."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import pytest

from services.collect import runner
from services.collect.dataset import read_runs
from services.collect.plan import collected, plan_tasks
from services.collect.runner import CollectPlan, collect, select_engines
from services.common.tracestore import read_trace_folder
from services.launcher.pool import load_pool, resolve_pool
from services.verify.answers import AnswerKey
from services.verify.checks import HumanEvalCheck
from services.workload.corpus import Problem
from services.workload.workflows import get_workflow

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

FAKE_CHECK = HumanEvalCheck(
    prompt="def f():\n", test="def check(candidate):\n    assert candidate() == 1\n", entry_point="f"
)
PROBLEMS = [
    Problem("humaneval/fake-1", "FAKE: write f() returning 1", "code", 0.2, "humaneval"),
    Problem("leetcode/fake-2", "FAKE: a task whose text may not be published", "code", 0.5, "leetcode"),
]


def test_collect_through_the_stack_exports_verified_runs_and_a_rerun_skips_them(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path_factory.mktemp("collect")
    pool_file = resolve_pool(Path("simulated"))
    pool = select_engines(load_pool(pool_file), ["qwen-1_5b", "Qwen/Qwen2.5-7B-Instruct"])  # id or model
    key = AnswerKey(MappingProxyType({p.id: FAKE_CHECK for p in PROBLEMS}))
    tasks = plan_tasks(PROBLEMS, lambda pid: key.get(pid) is not None, ("humaneval", "leetcode"), 1)
    plan = CollectPlan(base / "dataset", base / "state", max_tokens=16, concurrency=2, pin_cores=False)

    counts = collect(plan, pool, tasks, key, pool_file)

    assert counts["programs"] == 4  # two tasks on two engines
    traces, outcomes = read_trace_folder(plan.out)
    assert sorted(p.name for p in plan.out.glob("traces-*.jsonl")) == [
        "traces-qwen-1_5b.jsonl",
        "traces-qwen-7b.jsonl",
    ]
    assert {(o.engine, o.outcome) for o in outcomes} == {
        ("qwen-1_5b", 0.0),
        ("qwen-7b", 0.0),
    }  # checked, wrong
    assert {o.model for o in outcomes} == {e.model for e in pool.engines}  # each run pinned to its engine
    per_program = {o.program_id: 0 for o in outcomes}
    for t in traces:
        per_program[t.program_id] += 1
        assert t.engine == t.program_id.split(":")[1]
        leet = t.extra["source"] == "leetcode"
        assert (t.user_text == "") == leet and ("FAKE" in t.prompt_text) != leet
    workflow_of = {o.program_id: o.workflow for o in outcomes}
    assert all(n == get_workflow(workflow_of[pid]).n_stages for pid, n in per_program.items())  # every stage
    assert len(read_runs(plan.out)) == 4 and (plan.raw / "outcomes.jsonl").exists()

    def no_stack(*_: object, **__: object) -> None:
        raise AssertionError("a rerun with nothing to collect must not start the stack")

    monkeypatch.setattr(runner, "running_stack", no_stack)
    assert collect(plan, pool, tasks, key, pool_file) == counts
    assert len(collected(read_trace_folder(plan.out)[1])) == 4
