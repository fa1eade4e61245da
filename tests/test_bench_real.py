"""The real-outcome benchmark (bench/learned/real.py): folds held out by problem id, and the report's
fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.learned.real import DATA, load, main, problem_folds

pytestmark = pytest.mark.unit
ROOT = Path(__file__).parents[1]


def test_problem_folds_are_disjoint_and_cover_every_problem() -> None:
    ids = [f"p{i % 13}" for i in range(40)]
    folds = problem_folds(ids, 5, seed=3)
    flat = [p for f in folds for p in f]
    assert sorted(flat) == sorted(set(ids)) and len(flat) == len(set(flat))
    assert problem_folds(ids, 5, seed=3) == folds
    with pytest.raises(ValueError):
        problem_folds(ids, 14, seed=0)


def test_runs_on_the_committed_data_held_out_by_problem(tmp_path: Path) -> None:
    assert main(["--data", str(ROOT / DATA), "--folds", "3", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "real.json").read_text())
    data = load(ROOT / DATA)
    problem_of = data.problem_of()
    assert result["counts"]["workflows"] == len(data.runs)
    assert result["config"] == {"folds": 3, "seed": 0, "window": 64, "data": str(ROOT / DATA)}
    seen: set[str] = set()
    for fold in result["folds"]:
        test, train = set(fold["test_problems"]), set(fold["train_problems"])
        assert test and train and not test & train and not test & seen
        seen |= test
        assert fold["test_workflows"] == sum(problem_of[o.program_id] in test for o in data.outcomes)
        assert {"map", "prior_map", "prior_workflow_map"} <= set(fold["router"])
        assert {"kendall_tau_distance", "fcfs_distance", "input_length_distance"} <= set(fold["predictor"])
    assert seen == set(problem_of.values())
    for key in ("map", "prior_map", "gain_over_prior"):
        assert set(result["router"]["code"][key]) >= {"mean", "median", "min", "max", "n"}
    assert isinstance(result["target"]["met"], bool)
    assert result["pass_rates"]["oracle"]["tasks_on_all_engines"] > 0
    assert "small sample" in (tmp_path / "real.md").read_text()
