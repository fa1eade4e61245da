"""Generated traces: the live workers' row shape, round trip through JSONL, deterministic for a seed."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from services.common.tokens import approx_tokens
from services.common.tracestore import read_outcomes_jsonl, read_traces_jsonl
from services.common.types import OutcomeRow, TraceRow
from services.workload.corpus import embedded_corpus
from services.workload.generate import bindings_for, generate, history_filler, main, write_traces
from services.workload.outcome import OutcomeModel
from services.workload.workflows import get_workflow

MODELS = ("qwen2.5-1.5b", "qwen2.5-14b")


@pytest.fixture(scope="module")
def model() -> OutcomeModel:
    return OutcomeModel(embedded_corpus().problems, models=MODELS)


@pytest.mark.unit
def test_rows_round_trip_and_describe_each_program(model: OutcomeModel, tmp_path: Path) -> None:
    problems = embedded_corpus().problems
    programs = list(generate(problems, model, bindings_for(MODELS), n=60, seed=7))
    assert len(programs) == 120
    written = write_traces(tmp_path, iter(programs))
    assert sorted(p.name for p in written.trace_files) == [
        "traces-qwen2.5-1.5b.jsonl",
        "traces-qwen2.5-14b.jsonl",
    ]
    traces = [t for f in written.trace_files for t in read_traces_jsonl(f)]
    outcomes = read_outcomes_jsonl(written.outcome_file)
    assert sorted(traces, key=lambda t: t.request_id) == sorted(
        (t for p in programs for t in p.traces), key=lambda t: t.request_id
    )
    assert outcomes == [p.outcome for p in programs]
    assert all(TraceRow.from_json(t.to_json()) == t for t in traces)
    assert all(OutcomeRow.from_json(o.to_json()) == o for o in outcomes)

    by_program: dict[str, list[TraceRow]] = {}
    for t in traces:
        by_program.setdefault(t.program_id, []).append(t)
    for prog in programs:
        rows = sorted(by_program[prog.outcome.program_id], key=lambda t: t.stage)
        wf = get_workflow(prog.outcome.workflow)
        assert [r.stage for r in rows] == list(range(wf.n_stages))
        assert [r.completion_tokens for r in rows] == list(prog.detail.stage_tokens)
        assert prog.outcome.outcome == prog.detail.score
        assert all(r.predicted == 0 and r.queue_wait_s == 0.0 and r.run_s == 0.0 for r in rows)
        assert all(r.system_text == wf.roles[r.stage].system_prompt for r in rows)
        # Later stages carry the earlier outputs: a prompt grows by the previous output's tokens, give or take
        # the two roles' system prompts and the history headers (under 60 tokens).
        for a, b in zip(rows, rows[1:], strict=False):
            assert abs(b.prompt_tokens - a.prompt_tokens - a.completion_tokens) < 60
    assert Counter(o.model for o in outcomes) == {
        "Qwen/Qwen2.5-1.5B-Instruct": 60,
        "Qwen/Qwen2.5-14B-Instruct": 60,
    }


@pytest.mark.unit
def test_every_engine_runs_the_same_problem_and_workflow(model: OutcomeModel) -> None:
    programs = list(generate(embedded_corpus().problems, model, bindings_for(MODELS), n=10, seed=3))
    for small, large in zip(programs[::2], programs[1::2], strict=True):
        assert small.detail.problem_id == large.detail.problem_id
        assert small.outcome.workflow == large.outcome.workflow
        assert small.traces[0].user_text == large.traces[0].user_text
        assert small.outcome.program_id != large.outcome.program_id


@pytest.mark.unit
def test_history_filler_has_the_token_count_it_stands_for() -> None:
    for n in (0, 1, 25, 700):
        text = history_filler(1, "planner", n)
        assert "generated stand-in" in text
        assert approx_tokens(text) == max(n, approx_tokens(history_filler(1, "planner", 0)))


@pytest.mark.unit
def test_generation_is_deterministic_and_fast_via_the_module_entry(tmp_path: Path) -> None:
    for out in ("a", "b"):
        assert main(["--out", str(tmp_path / out), "--n", "300", "--seed", "5", "--embedded"]) == 0
    for name in ("outcomes.jsonl", "traces-qwen2.5-7b.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a" / "outcomes.jsonl").read_text().count("\n") == 900
