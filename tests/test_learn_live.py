"""The live learning loop's pure parts (bench/learn_*.py): the task split, the held-out examples, the report.

No stack, no engine, no Celery: the records are made up here, shaped as ``bench.live.policy``,
``bench.learned.learn_serve`` and ``bench.learned.learn_jobs`` write them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from bench.learned.learn_jobs import JobRun, JobsSetup, wait_served
from bench.learned.learn_plan import TaskSplit, TrainTask, label_counts, map_examples, map_tasks, split
from bench.learned.learn_report import LoopRecord, MapScore, beside_live, build, flips, floors, markdown
from bench.learned.learn_serve import LabelRecord
from bench.live.policy import PolicyRun, StageRecord, WorkflowRecord
from services.collect.dataset import RunRecord
from services.common.types import OutcomeRow, TraceRow
from services.workload.corpus import Problem

pytestmark = pytest.mark.unit
SMALL, BIG = "M-small", "M-big"


def _problem(n: int) -> Problem:
    return Problem(f"humaneval/{n}", f"write function number {n}", "code", 0.5, "humaneval")


def _run(problem: int, workflow: str, model: str, score: float, k: int = 0) -> RunRecord:
    return RunRecord(
        f"p-{problem}-{workflow}-{model}-{k}", model, model, workflow, f"humaneval/{problem}", 1, 10, 20,
        1.0, "humaneval", score, "", 0.0, 256, 4,
    )  # fmt: skip


def _trace(r: RunRecord) -> TraceRow:
    return TraceRow(
        f"{r.program_id}-s0", r.program_id, r.workflow, 0, r.engine, r.model, "sys",
        f"task {r.problem_id}", "", 10, 20, 0, 0, 0.0, 1.0, "stop",
    )  # fmt: skip


def _outcome(r: RunRecord) -> OutcomeRow:
    return OutcomeRow(r.program_id, r.workflow, r.model, r.engine, r.score)


def test_map_tasks_are_the_ones_labelled_on_every_model() -> None:
    runs = [
        _run(1, "code/coder", SMALL, 1.0),
        _run(1, "code/coder", BIG, 0.0),
        _run(2, "code/coder", SMALL, 1.0),  # never on BIG: not a held-out task
        _run(3, "code/planner-coder", BIG, 1.0),
        _run(3, "code/planner-coder", SMALL, 0.0),
    ]
    assert map_tasks(runs, [SMALL, BIG]) == [
        ("humaneval/1", "code/coder"),
        ("humaneval/3", "code/planner-coder"),
    ]


def test_map_examples_keep_one_run_per_task_and_model() -> None:
    runs = [
        _run(1, "code/coder", SMALL, 1.0, k=0),
        _run(1, "code/coder", SMALL, 0.0, k=1),  # a second run of the same task on the same model
        _run(1, "code/coder", BIG, 1.0),
        _run(2, "code/coder", SMALL, 0.0),
    ]
    traces, outcomes = [_trace(r) for r in runs], [_outcome(r) for r in runs]
    examples = map_examples(traces, outcomes, runs, [("humaneval/1", "code/coder")])
    assert sorted((e.model, e.outcome) for e in examples) == [(BIG, 1.0), (SMALL, 1.0)]


def test_the_split_keeps_training_apart_from_the_eval_trace_and_the_map_tasks() -> None:
    corpus = [_problem(n) for n in range(40)]
    checked = {p.id for p in corpus}
    runs = [_run(n, "code/coder", m, 1.0) for n in range(5) for m in (SMALL, BIG)]
    plan = split(corpus, checked, runs, [SMALL, BIG], 3, 6, 20, 0, ["code/coder", "code/planner-coder"])
    train = {t.problem.id for t in plan.training}
    assert len(plan.eval_trace) == 3 and len(plan.training) == 20
    assert not train & {p.id for p in plan.eval_trace}
    assert not train & {f"humaneval/{n}" for n in range(5)}
    # all of bench.live.run's trace (6), not only the 3 replayed, stays out of training: 40 - 5 - 6 = 29 left
    with pytest.raises(ValueError, match="only 29"):
        split(corpus, checked, runs, [SMALL, BIG], 3, 6, 30, 0, ["code/coder"])
    assert [t.workflow for t in plan.training[:3]] == ["code/coder", "code/planner-coder", "code/coder"]
    # seeded: the same draw again
    again = split(corpus, checked, runs, [SMALL, BIG], 3, 6, 20, 0, ["code/coder", "code/planner-coder"])
    assert again == plan


def test_an_overlapping_split_is_refused() -> None:
    p = _problem(1)
    bad = TaskSplit((p,), (), (TrainTask(0, p, "code/coder"),))
    with pytest.raises(ValueError, match="overlap"):
        bad.check_disjoint()


def test_floors_rank_by_model_rate_and_by_workflow() -> None:
    runs = [
        _run(n, w, m, float((n + (w == "code/coder") + (m == BIG)) % 2))
        for n in range(6)
        for w in ("code/coder", "code/planner-coder")
        for m in (SMALL, BIG)
    ]
    traces, outcomes = [_trace(r) for r in runs], [_outcome(r) for r in runs]
    examples = map_examples(traces, outcomes, runs, map_tasks(runs, [SMALL, BIG]))
    out = floors(traces, outcomes, examples)
    # text-blind and one rate per model: every task of a model ties, so AP is the model's pass rate
    assert out["prior_only"].map == pytest.approx(0.5)
    assert set(out["prior_workflow"].by_workflow) == {"code/coder", "code/planner-coder"}
    assert out["prior_only"].to_json()["by_workflow"]["code/coder"] == pytest.approx(0.5)


def test_label_counts_per_model() -> None:
    rows = [OutcomeRow("a", "w", SMALL, "e0", 1.0), OutcomeRow("b", "w", SMALL, "e0", 0.0)]
    rows.append(OutcomeRow("c", "w", BIG, "e1", 1.0))
    assert label_counts(rows) == {BIG: {"labels": 1, "passed": 1}, SMALL: {"labels": 2, "passed": 1}}


def test_the_jobs_worker_reads_the_learning_prefix_and_the_served_folders(tmp_path: Path) -> None:
    s = JobsSetup(tmp_path / "r.sock", "learnX", tmp_path / "t", tmp_path / "a", tmp_path / "j", 10)
    env = s.env()
    assert env["CHIMERA_KEY_PREFIX"] == "learnX"
    assert env["CHIMERA_ROUTER_ARTIFACT_DIR"] == str(tmp_path / "a" / "router")
    assert env["CHIMERA_JOBS_RETRAIN_INTERVAL_S"] == "0"
    settings = s.settings()
    assert settings.queue == env["CHIMERA_JOBS_QUEUE"] and settings.broker_url.endswith("virtual_host=1")


def test_wait_served_returns_once_the_version_is_served_and_times_out_otherwise() -> None:
    answers = iter(["v1", "v1", "v2"])
    assert wait_served(lambda: next(answers), "v2", 5.0, poll_s=0.0) >= 0.0
    with pytest.raises(TimeoutError, match="still serving v1"):
        wait_served(lambda: "v1", "v2", 0.01, poll_s=0.005)


def _policy(name: str, models: list[str], scores: list[float | None]) -> PolicyRun:
    flows = tuple(
        WorkflowRecord(
            i,
            f"humaneval/{i}",
            "",
            float(i),
            float(i),
            10.0 + i,
            s,
            "",
            "",
            (StageRecord(m, m, 10, 20, 30, 0.1, 5.0), StageRecord(m, m, 10, 20, 30, 0.2, 5.0 + i)),
        )  # fmt: skip
        for i, (m, s) in enumerate(zip(models, scores, strict=True))
    )
    return PolicyRun(name, 0.0, 60.0, flows, {}, {"e0": 3})


def _record() -> LoopRecord:
    before = _policy("before-chimera-tau2", [SMALL, SMALL, BIG], [1.0, 0.0, 1.0])
    after = _policy("after-chimera-tau2", [SMALL, BIG, BIG], [0.0, 1.0, 1.0])
    labels = tuple(
        LabelRecord(e, m, t, f"humaneval/{10 + t}", "code/coder", 1.0, 9.0, 50, "")
        for e, m, n in (("e0", SMALL, 4), ("e1", BIG, 2))
        for t in range(n)
    )
    outcomes = tuple(OutcomeRow(f"p{r.engine}{r.task}", r.workflow, r.model, r.engine, 1.0) for r in labels)
    maps = {
        "before": MapScore("v-boot", 0.5, {SMALL: 0.4, BIG: 0.6}, {"code/coder": 0.45}),
        "after": MapScore("v-new", 0.7, {SMALL: 0.6, BIG: 0.8}, {"code/coder": 0.65}),
        "prior_only": MapScore("prior-only", 0.55, {SMALL: 0.45, BIG: 0.65}, {"code/coder": 0.5}),
        "prior_workflow": MapScore("prior-workflow", 0.6, {SMALL: 0.5, BIG: 0.7}, {"code/coder": None}),
    }
    config = {
        "pool": "p", "engines": ["e0", "e1"], "models": [SMALL, BIG], "tau": 2.0, "eval_tasks": 3,
        "live_tasks": 16, "rate": 0.12, "seed": 0, "max_tokens": [128, 256],
        "eval_workflow": "code/planner-coder", "learn_s": 600.0, "learn_workflows": ["code/coder"],
        "learn_max_tokens": 256, "data": "bench/data/real", "bootstrap_workflows": 3000,
    }  # fmt: skip
    jobs = (
        JobRun("chimera.jobs.export_traces", {"rows": 12, "streams": [{"path": "x"}]}, 0.1),
        JobRun("chimera.jobs.retrain_router", {"version": "v-new", "served_after_s": 1.5}, 2.0),
        JobRun("chimera.jobs.retrain_predictor", {"version": "p-new", "served_after_s": 0.5}, 3.0),
    )
    versions = {
        "router_bootstrap": "v-boot", "router_served_before": "v-boot", "router_retrained": "v-new",
        "router_served_after": "v-new", "router_reload_s": 1.5, "predictor_bootstrap": "p-boot",
        "predictor_retrained": "p-new", "predictor_reload_s": 0.5,
    }  # fmt: skip
    return LoopRecord(
        "python -m bench.learned.learn_live", "2026-01-01 00:00", config, ("humaneval/0",), (0.0, 1.0, 2.0),
        (("humaneval/1", "code/coder"),), 2, maps, before, after, labels, outcomes, 12, {"e0": 3}, jobs,
        versions, {"total": 100.0}, {},
    )  # fmt: skip


def test_build_reports_before_and_after_from_the_records() -> None:
    result = build(_record())
    s = result["summary"]
    assert (s["map_before"], s["map_after"], s["map_gain"], s["prior_map"]) == (0.5, 0.7, 0.2, 0.55)
    assert s["prior_workflow_map"] == 0.6
    assert s["live_score_before"] == pytest.approx(2 / 3, abs=1e-4)
    assert s["live_score_after"] == pytest.approx(2 / 3, abs=1e-4)
    assert s["share_after"] == {BIG: pytest.approx(0.667, abs=1e-3), SMALL: pytest.approx(0.333, abs=1e-3)}
    assert s["labels"] == {BIG: {"labels": 2, "passed": 2}, SMALL: {"labels": 4, "passed": 4}}
    assert (s["router_before"], s["router_after"]) == ("v-boot", "v-new")
    assert result["learning"]["both"] == 2  # tasks 0 and 1 reached on both engines
    # task 0: SMALL both times, 1 -> 0: a flip; task 1 changed model; task 2: BIG both times, same outcome
    assert result["flips"] == 1
    json.dumps(result)  # what real_learn.json holds must be plain JSON
    # the figures apart from the records: bench.learned.real copies "before"/"after" into real.json
    assert "workflows" not in result["before"] and len(result["eval_workflows"]["after"]) == 3


def test_flips_needs_the_same_model_in_both_passes() -> None:
    before = _policy("b", [SMALL, SMALL], [1.0, 1.0])
    after = _policy("a", [BIG, SMALL], [0.0, None])  # another model; the same model, not verified
    assert flips(before, after) == 1


def test_markdown_shows_every_figure_it_is_given() -> None:
    md = markdown(build(_record()))
    assert "| before | `v-boot` | 0.500 |" in md and "| after | `v-new` | 0.700 |" in md
    assert "| prior-only | `prior-only` | 0.550 | 0.450 | 0.650 | 0.500 |" in md
    assert "| prior-workflow | `prior-workflow` | 0.600 | 0.500 | 0.700 | – |" in md
    assert "| M-small | 4 | 4 | 1.000 |" in md
    assert "`v-boot` → retrained `v-new`" in md and "1.5 s after" in md
    assert "'path'" not in md  # the export's per-stream paths stay in the JSON
    assert "one task moves the pass rate by 0.333" in md


def test_bench_live_runs_of_the_same_trace_are_cut_to_the_eval_length(tmp_path: Path) -> None:
    config = _record().config
    run = _policy("least-loaded", [SMALL, BIG, BIG, BIG], [1.0, 1.0, 0.0, 0.0])
    live: dict[str, Any] = {
        "command": "python -m bench.live",
        "config": {"seed": 0, "rate": 0.12, "max_tokens": [128, 256], "engines": ["e0", "e1"], "tasks": 4,
                   "workflow": "code/planner-coder"},
        "runs": {"least-loaded": asdict(run)},
    }  # fmt: skip
    path = tmp_path / "real_live.json"
    path.write_text(json.dumps(live))
    got = beside_live(path, config)
    assert got["policies"]["least-loaded"]["score"] == pytest.approx(2 / 3, abs=1e-4)  # the first 3 only
    assert "workflows" not in got["policies"]["least-loaded"]
    md = markdown(build(dataclasses.replace(_record(), beside=got)))
    assert "| least-loaded | 0.667 |" in md and "went on to 4 arrivals" in md
    live["config"]["rate"] = 0.2  # another trace: nothing to compare with
    path.write_text(json.dumps(live))
    assert beside_live(path, config) == {}
    assert beside_live(tmp_path / "absent.json", config) == {}
