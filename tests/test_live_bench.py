"""The live evaluation's pure parts (bench/live_*.py): the trace, the pins, the simulator side, the verdict.

No stack and no model: the live records are made up here (FAKE), shaped as ``bench.live.policy`` writes them.
"""

from __future__ import annotations

import json

import pytest

from bench.live.plan import (
    arrival_offsets,
    default_policies,
    held_out_problems,
    parse_policy,
    pins,
)
from bench.live.policy import PolicyRun, StageRecord, WorkflowRecord
from bench.live.report import markdown, must_show
from bench.live.sim import Outcome, diff, live_outcome, passed, sim_jobs, sim_outcome, sim_specs
from services.common.types import EngineProfile
from services.workload.corpus import Problem

pytestmark = pytest.mark.unit
ENGINES = ("fast", "slow")
MODELS = {"fast": "M-fast", "slow": "M-slow"}


def _problem(n: int) -> Problem:
    return Problem(f"humaneval/{n}", f"FAKE task {n}", "code", 0.5, "humaneval")


def test_held_out_problems_skip_the_training_set_and_are_seeded() -> None:
    probs = [_problem(n) for n in range(30)]
    trained = {f"humaneval/{n}" for n in range(0, 30, 2)}
    got = held_out_problems(probs, trained, {p.id for p in probs}, 8, seed=1)
    assert len(got) == 8 and not {p.id for p in got} & trained
    assert got == held_out_problems(list(reversed(probs)), trained, {p.id for p in probs}, 8, seed=1)
    with pytest.raises(ValueError):
        held_out_problems(probs, trained, {p.id for p in probs}, 16, seed=1)


def test_arrivals_start_at_zero_and_grow() -> None:
    a = arrival_offsets(10, 0.5, seed=3)
    assert a[0] == 0.0 and all(x < y for x, y in zip(a, a[1:], strict=False))
    assert a == arrival_offsets(10, 0.5, seed=3) != arrival_offsets(10, 0.5, seed=4)


def test_policies_parse_and_pin() -> None:
    assert default_policies(ENGINES)[:2] == ["alone-fast", "alone-slow"]
    chim = parse_policy("chimera-tau2", ENGINES)
    assert (chim.dispatcher_policy, chim.tau, chim.pin, chim.sim_variant) == ("chimera", 2.0, "", "chimera")
    assert parse_policy("least-loaded", ENGINES).sim_variant == "vllm"
    with pytest.raises(ValueError):
        parse_policy("alone-nope", ENGINES)
    assert pins(parse_policy("alone-slow", ENGINES), 3, ENGINES, MODELS) == ["M-slow"] * 3
    assert pins(parse_policy("round-robin", ENGINES), 3, ENGINES, MODELS) == ["M-fast", "M-slow", "M-fast"]
    oracle = parse_policy("oracle", ENGINES)
    with pytest.raises(ValueError):
        pins(oracle, 3, ENGINES, MODELS)
    ok = {"fast": [True, False, False], "slow": [True, True, False]}
    # Fast when it passes there, else the stronger model (also when neither passes).
    assert pins(oracle, 3, ENGINES, MODELS, ok, ["fast", "slow"]) == ["M-fast", "M-slow", "M-slow"]


def _run(name: str, engine: str, scores: list[float], e2e: float, pinned: bool = True) -> PolicyRun:
    model = MODELS[engine]
    flows = tuple(
        WorkflowRecord(
            index=i,
            problem_id=f"humaneval/{i}",
            pinned=model if pinned else "",
            arrival_s=10.0 * i,
            sent_s=10.0 * i,
            e2e_s=e2e + i,
            score=s,
            detail="FAKE",
            error="",
            stages=(
                StageRecord(engine, model, 100, 50, 120, 1.0, e2e / 2),
                StageRecord(engine, model, 200, 70, 70, 2.0 if engine == "slow" else 0.0, e2e / 2),
            ),
        )
        for i, s in enumerate(scores)
    )
    return PolicyRun(name, 0.0, 100.0, flows, {}, {})


def _profile(ms: float) -> str:
    return EngineProfile(ms, 4, 0.5, ((1, ms), (4, 1.5 * ms))).to_json()


def test_the_simulator_side_replays_the_alone_runs_with_the_same_pins() -> None:
    fast = _run("alone-fast", "fast", [1.0, 0.0, 1.0, 0.0], 20.0)
    slow = _run("alone-slow", "slow", [1.0, 1.0, 0.0, 0.0], 60.0)
    conf = [{"M-fast": 0.2, "M-slow": 0.9}] * 4
    jobs, skipped = sim_jobs({"fast": fast, "slow": slow}, conf)
    assert len(jobs) == 4 and skipped == []
    assert jobs[0].runs["M-fast"].stages[0].true_remaining == 120
    specs = sim_specs(
        {"M-fast": _profile(50.0), "M-slow": _profile(150.0)},
        {"M-fast": None, "M-slow": 10**6},
        {"M-fast": 4, "M-slow": 4},
    )
    arrivals = [10.0 * i for i in range(4)]
    rates = {"M-fast": sum(passed(fast)) / 4, "M-slow": sum(passed(slow)) / 4}
    pool = ["M-fast", "M-slow"]
    alone = sim_outcome(
        parse_policy("alone-slow", ENGINES), jobs, specs, pool, arrivals, ["M-slow"] * 4, 0.1, rates
    )
    assert alone.share == {"M-slow": 1.0} and alone.score == 0.5 and alone.score_at_rates == 0.5
    oracle_pins = pins(
        parse_policy("oracle", ENGINES),
        4,
        ENGINES,
        MODELS,
        {"fast": passed(fast), "slow": passed(slow)},
        ["fast", "slow"],
    )
    oracle = sim_outcome(
        parse_policy("oracle", ENGINES), jobs, specs, pool, arrivals, oracle_pins, 0.1, rates
    )
    assert oracle.score == 0.75  # task 3 fails on both
    chim = sim_outcome(
        parse_policy("chimera-tau8", ENGINES), jobs, specs, pool, arrivals, [""] * 4, 0.1, rates
    )
    assert chim.workflows == 4 and 0.0 <= chim.score <= 1.0
    live = live_outcome(slow)
    assert live.score == 0.5 and live.share == {"M-slow": 1.0} and live.queue_mean_s["M-slow"] == 1.5
    assert diff(live, alone)["score"] == 0.0


def _o(score: float, mean: float) -> Outcome:
    return Outcome(8, score, mean, mean, {"M-slow": 0.5}, {"M-slow": 3.0}, 0.5)


def test_must_show_compares_the_best_tau_with_least_loaded() -> None:
    rows = {
        "alone-fast": {"live": _o(0.5, 40), "sim": _o(0.5, 40)},
        "alone-slow": {"live": _o(0.7, 90), "sim": _o(0.7, 90)},
        "least-loaded": {"live": _o(0.6, 60), "sim": _o(0.6, 60)},
        "chimera-tau0.5": {"live": _o(0.65, 55), "sim": _o(0.62, 50)},
        "chimera-tau8": {"live": _o(0.8, 80), "sim": _o(0.8, 85)},
        "oracle": {"live": _o(0.9, 50), "sim": _o(0.9, 50)},
    }
    ms = must_show(rows)
    assert ms["live"]["best_tau"] == "chimera-tau0.5" and ms["live"]["holds"]
    vs = ms["live"]["vs_strongest"]
    assert vs["strongest"] == "alone-slow" and vs["best_chimera_score_within_its_latency"] == 0.8
    assert vs["share_of_oracle_gain_captured"] == pytest.approx(0.5)
    assert ms["gain_live_minus_sim"] == pytest.approx(0.05 - 0.02)
    rows["least-loaded"] = {"live": _o(0.7, 50), "sim": _o(0.7, 50)}
    assert not must_show(rows)["live"]["holds"]


def test_the_markdown_names_every_policy() -> None:
    rows = {
        "least-loaded": {"live": _o(0.6, 60), "sim": _o(0.6, 60)},
        "chimera-tau2": {"live": _o(0.7, 50), "sim": None},
    }
    result = {
        "command": "python -m bench.live",
        "config": {
            "tasks": 8,
            "workflow": "code/planner-coder",
            "data": "d",
            "rate": 0.1,
            "seed": 0,
            "max_tokens": [128, 256],
            "max_num_seqs": 4,
        },
        "engines": {
            e: {"model": m, "profile": json.loads(_profile(50.0 if e == "fast" else 150.0))}
            for e, m in MODELS.items()
        },
        "problems": ["humaneval/1"],
        "must_show": must_show(rows),  # type: ignore[arg-type]
        "not_run": ["oracle"],
    }
    md = markdown(result, rows, {"least-loaded": diff(_o(0.6, 60), _o(0.6, 60))})  # type: ignore[arg-type]
    assert "| least-loaded |" in md and "| chimera-tau2 |" in md and "Not run in this result: oracle" in md
