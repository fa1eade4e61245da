"""The real-trace collection's own logic, without models: the task plan, run ids, what counts as collected,
and the committed dataset (programs kept, texts redacted outside HumanEval, idempotent merges). Rows here are
FAKE rows written by the test, shaped like the product's export."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from services.collect.dataset import RUNS, RunRecord, append_run, publish, read_runs
from services.collect.pinning import core_plan, pin_tree, process_tree
from services.collect.plan import (
    Task,
    collected,
    parse_program_id,
    pending,
    plan_tasks,
    program_id,
)
from services.common.tracestore import read_trace_folder, write_jsonl
from services.common.types import OutcomeRow, TraceRow
from services.jobs.export import outcome_file, trace_file
from services.workload.corpus import Problem
from services.workload.workflows import WORKFLOWS, get_workflow

pytestmark = pytest.mark.unit


def _problem(pid: str) -> Problem:
    source = pid.split("/", 1)[0]
    domain = "code" if source in ("humaneval", "leetcode") else "math"
    return Problem(id=pid, text=f"FAKE task {pid}", domain=domain, difficulty=0.5, source=source)


PROBLEMS = [_problem(f"{s}/{i}") for s in ("humaneval", "leetcode", "gsm") for i in range(10)]


def test_plan_interleaves_sources_cycles_workflows_and_only_takes_checkable_problems() -> None:
    checkable = {p.id for p in PROBLEMS if not p.id.endswith("/9")}
    plan = plan_tasks(PROBLEMS, checkable.__contains__, ("humaneval", "gsm"), per_source=4, seed=1)
    assert [t.problem.source for t in plan] == ["humaneval", "gsm"] * 4
    assert all(t.problem.id in checkable for t in plan)
    code = [t.workflow.name for t in plan if t.problem.source == "humaneval"]
    assert code[:3] == [w.name for w in WORKFLOWS if w.domain == "code"]  # every workflow, every stage count
    assert all(t.workflow.domain == t.problem.domain for t in plan)


def test_a_bigger_plan_extends_a_smaller_one_and_a_source_runs_out_gracefully() -> None:
    small = plan_tasks(PROBLEMS, lambda _: True, ("humaneval", "leetcode"), per_source=3)
    big = plan_tasks(PROBLEMS, lambda _: True, ("humaneval", "leetcode"), per_source=20)
    assert big[: len(small)] == small
    assert len(big) == 20  # ten of each: the sources' sizes
    assert plan_tasks(PROBLEMS, lambda _: True, ("humaneval",), 3, seed=0) != plan_tasks(
        PROBLEMS, lambda _: True, ("humaneval",), 3, seed=5
    )


def test_program_ids_round_trip_and_other_ids_are_not_collection_runs() -> None:
    task = Task(_problem("leetcode/two-sum"), get_workflow("code/planner-coder-qa-coder"))
    pid = program_id(task, "coder-1_5b", "abc123")
    run = parse_program_id(pid)
    assert run is not None
    assert (run.engine, run.workflow, run.problem_id, run.nonce, run.source) == (
        "coder-1_5b",
        "code/planner-coder-qa-coder",
        "leetcode/two-sum",
        "abc123",
        "leetcode",
    )
    for other in ("demo-abc", "real:e:x:humaneval/1:n", "real:e:99:humaneval/1:n", "real:e:0:nonce-only"):
        assert parse_program_id(other) is None


def test_only_runs_with_an_outcome_count_as_collected_and_the_rest_is_pending() -> None:
    tasks = plan_tasks(PROBLEMS, lambda _: True, ("humaneval",), per_source=2)
    pid = program_id(tasks[0], "small", "n1")
    outcomes = [
        OutcomeRow(pid, tasks[0].workflow.name, "m", "small", 1.0),
        OutcomeRow("demo-123", "code/coder", "m", "small", 0.0),  # not a collection run: ignored
    ]
    done = collected(outcomes)
    assert done == {("small", *tasks[0].key)}
    todo = pending(tasks, ["small", "big"], done)
    assert todo == [("big", tasks[0]), ("small", tasks[1]), ("big", tasks[1])]


def _fake_trace(pid: str, stage: int, engine: str, user: str = "FAKE task text") -> TraceRow:
    return TraceRow(
        request_id=f"{pid}-s{stage}",
        program_id=pid,
        workflow="code/planner-coder",
        stage=stage,
        engine=engine,
        model=f"model-of-{engine}",
        system_text="FAKE role prompt",
        user_text=user,
        prompt_text=f"FAKE role prompt\n{user}",
        prompt_tokens=40 + stage,
        completion_tokens=100 + stage,
        predicted=90,
        predicted_p90=200,
        queue_wait_s=0.1,
        run_s=2.0,
        finish_reason="stop",
        enqueued_unix=1000.0 + stage,
    )


def _fake_run(pid: str, engine: str, detail: str) -> RunRecord:
    run = parse_program_id(pid)
    assert run is not None
    return RunRecord(pid, engine, f"model-of-{engine}", run.workflow, run.problem_id, 2, 81, 201, 12.5,
                     "humaneval", 0.0, detail, 1000.0, 512, 4)  # fmt: skip


def _fake_export(raw: Path) -> dict[str, str]:
    """A raw export as ``services.jobs.export`` lays it out: a MIT run, a LeetCode run, an unfinished run."""
    wf = get_workflow("code/planner-coder")
    pids = {
        "mit": program_id(Task(_problem("humaneval/7"), wf), "small", "n1"),
        "leet": program_id(Task(_problem("leetcode/two-sum"), wf), "small", "n2"),
        "cut": program_id(Task(_problem("humaneval/8"), wf), "small", "n3"),  # no outcome: cut short
    }
    rows = [_fake_trace(pid, s, "small") for pid in pids.values() for s in (0, 1)]
    rows.append(_fake_trace(pids["mit"], 1, "small"))  # exported twice (a retried export): kept once
    write_jsonl(trace_file(raw, "small"), rows)
    write_jsonl(
        outcome_file(raw),
        [
            OutcomeRow(pids["mit"], wf.name, "model-of-small", "small", 1.0),
            OutcomeRow(pids["leet"], wf.name, "model-of-small", "small", 0.0),
            OutcomeRow("demo-xyz", wf.name, "model-of-small", "small", 1.0),  # another program: not ours
        ],
    )
    append_run(raw, _fake_run(pids["mit"], "small", "passed 9 tests"))
    append_run(raw, _fake_run(pids["leet"], "small", "answer 12, expected 391"))
    return pids


def test_publish_keeps_finished_runs_in_the_export_layout_and_redacts_what_is_not_mit(tmp_path: Path) -> None:
    raw, out = tmp_path / "raw", tmp_path / "dataset"
    pids = _fake_export(raw)
    counts = publish(raw, out)
    assert counts == {"programs": 2, "traces": 4, "runs": 2}
    assert sorted(p.name for p in out.iterdir()) == [
        "outcomes.jsonl",
        "runs.jsonl",
        "summary.json",
        "traces-small.jsonl",
    ]
    traces, outcomes = read_trace_folder(out)  # what `chimera train --traces` reads
    assert {o.program_id for o in outcomes} == {pids["mit"], pids["leet"]}
    mit = [t for t in traces if t.program_id == pids["mit"]]
    leet = [t for t in traces if t.program_id == pids["leet"]]
    assert all(t.user_text == "FAKE task text" and t.extra["problem_id"] == "humaneval/7" for t in mit)
    for t in leet:  # ids, lengths and outcomes only
        assert (t.user_text, t.prompt_text) == ("", "")
        assert t.extra == {
            "problem_id": "leetcode/two-sum",
            "source": "leetcode",
            "redacted": True,
            "user_chars": len("FAKE task text"),
            "prompt_chars": len("FAKE role prompt\nFAKE task text"),
        }
        assert t.prompt_tokens and t.completion_tokens and t.system_text == "FAKE role prompt"
    raw_text = (out / "traces-small.jsonl").read_text() + (out / RUNS).read_text()
    assert "expected 391" not in raw_text and "passed 9 tests" in raw_text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["small"]["workflows"] == 2 and summary["small"]["pass_rate"] == 0.0


def test_publish_is_idempotent_and_merges_later_exports(tmp_path: Path) -> None:
    raw, out = tmp_path / "raw", tmp_path / "dataset"
    _fake_export(raw)
    publish(raw, out)
    first = {p.name: p.read_text() for p in out.iterdir()}
    publish(raw, out)  # a rerun folds the same export in again: nothing changes (lengths not zeroed)
    assert {p.name: p.read_text() for p in out.iterdir()} == first
    # A later collect run: a fresh export folder holding only its own rows; the dataset keeps the old ones.
    raw2 = tmp_path / "raw2"
    pid = program_id(Task(_problem("humaneval/9"), get_workflow("code/coder")), "big", "n9")
    write_jsonl(trace_file(raw2, "big"), [_fake_trace(pid, 0, "big")])
    write_jsonl(outcome_file(raw2), [OutcomeRow(pid, "code/coder", "model-of-big", "big", 1.0)])
    counts = publish(raw2, out)
    assert counts["programs"] == 3 and (out / "traces-big.jsonl").exists()
    assert len(read_runs(out)) == 2  # the new run has no record of its own: its outcome still counts
    assert ("big", "code/coder", "humaneval/9") in collected(read_trace_folder(out)[1])


def test_core_plan_gives_each_engine_its_own_core_while_there_are_enough() -> None:
    assert core_plan(["a", "b"], [0, 1]) == {"a": {0}, "b": {1}}
    assert core_plan(["a", "b", "c"], [0, 1]) == {"a": {0}, "b": {1}, "c": {0}}
    with pytest.raises(ValueError):
        core_plan(["a"], [])


def test_pin_tree_pins_every_thread_of_a_process_and_its_children() -> None:
    # A real process tree (not an engine): a parent with a sleeping child.
    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(100):
            tree = process_tree(proc.pid)
            if len(tree) == 2:
                break
            subprocess.run(["sleep", "0.05"], check=True)
        assert len(tree) == 2
        core = sorted(os.sched_getaffinity(0))[-1]
        assert pin_tree(proc.pid, {core}) >= 2
        assert all(os.sched_getaffinity(pid) == {core} for pid in tree)
    finally:
        for pid in reversed(process_tree(proc.pid)):
            os.kill(pid, signal.SIGKILL)
        proc.wait()
