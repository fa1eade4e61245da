"""The benchmark simulator on tiny configurations, and a smoke run of the sweep (bench.sweep.run) end to end.

The jobs here are hand-made (a fake workload: fixed stage lengths and scores), so the expected times can be
computed by hand; the smoke test at the end trains the real router and predictor on a small trace set.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from bench.sweep.sim import EngineSpec, SimConfig, simulate, summarize
from bench.sweep.workload import Job, Run, Stage
from services.common.types import EngineProfile, EngineSnapshot
from services.policy.contract import Policy, Selection
from services.policy.registry import POLICIES

pytestmark = pytest.mark.unit

FAST = EngineProfile(10.0, 4, 0.5, ((1, 10.0), (4, 20.0)))
SLOW = EngineProfile(40.0, 4, 1.0, ((1, 40.0), (4, 60.0)))


def _job(i: int, outs: Sequence[int], prompt: int = 100, score_fast: float = 0.0) -> Job:
    def run(score: float) -> Run:
        stages = tuple(
            Stage(prompt + 10 * k, o, pred_total=sum(outs[k:]), pred_stage=o, true_remaining=sum(outs[k:]))
            for k, o in enumerate(outs)
        )
        return Run(stages, score, score >= 0.5)

    runs = {"fast": run(score_fast), "slow": run(1.0)}
    return Job(
        i,
        "code/planner-coder",
        runs,
        q_learned={"fast": 0.2, "slow": 0.8},
        q_prior={"fast": 0.3, "slow": 0.6},
        q_oracle={"fast": score_fast, "slow": 1.0},
    )


JOBS = tuple(_job(i, (20 + 7 * (i % 5), 40 + 13 * (i % 3))) for i in range(40))
SPECS = {"fast": EngineSpec(FAST, kv_tokens=100_000), "slow": EngineSpec(SLOW, kv_tokens=100_000)}


def test_one_stage_on_an_idle_engine_matches_hand_computation() -> None:
    job = _job(0, (50,), prompt=200)
    res = simulate([job], SimConfig(("fast",), 1.0, "vllm"), SPECS)
    (wf,) = res.workflows
    # Prefill stalls 200 * 0.5 ms, then 50 tokens at step(1) = 10 ms.
    assert wf.e2e_s == pytest.approx((200 * 0.5 + 50 * 10.0) / 1000)
    assert wf.queue_s == (0.0,)
    assert wf.tokens == 50


@pytest.mark.parametrize("variant", ["vllm", "mlfq", "ltr", "vllm-stjf", "chimera", "chimera-plus"])
def test_deterministic_for_a_seed_and_conserves_requests(variant: str) -> None:
    cfg = SimConfig(("fast", "slow"), 20.0, variant, tau=1.0, seed=3)
    a, b = simulate(JOBS, cfg, SPECS), simulate(JOBS, cfg, SPECS)
    assert a == b
    assert sorted(w.job for w in a.workflows) == list(range(len(JOBS)))
    assert a.select_calls == len(JOBS)
    assert a.priority_calls == sum(len(j.runs["fast"].stages) for j in JOBS)
    assert all(len(w.queue_s) == 2 for w in a.workflows)
    other = simulate(JOBS, SimConfig(("fast", "slow"), 20.0, variant, tau=1.0, seed=4), SPECS)
    assert [w.arrival_s for w in other.workflows] != [w.arrival_s for w in a.workflows]


class _Counting:
    """Wraps a registered policy and counts calls; the decisions stay the product's."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.selects = 0
        self.priorities = 0

    def select(
        self, engines: Sequence[EngineSnapshot], confidence: Mapping[str, float], tau: float, delta_s: float
    ) -> Selection:
        self.selects += 1
        return self.inner.select(engines, confidence, tau, delta_s)

    def priority(self, size_tokens: int, enqueued_unix: float, aging_rate: float, cap: int) -> float:
        self.priorities += 1
        return self.inner.priority(size_tokens, enqueued_unix, aging_rate, cap)


def test_calls_the_product_policy_functions() -> None:
    counter = _Counting(POLICIES["chimera"])
    wrapped = dict(POLICIES)
    wrapped["chimera"] = Policy(
        "chimera", counter.select, counter.priority, POLICIES["chimera"].priority_input
    )
    cfg = SimConfig(("fast", "slow"), 20.0, "chimera", tau=2.0)
    res = simulate(JOBS, cfg, SPECS, policies=wrapped)
    assert counter.selects == len(JOBS) == res.select_calls
    assert counter.priorities == res.priority_calls == 2 * len(JOBS)
    assert res == simulate(JOBS, cfg, SPECS)  # counting changed nothing


def test_affinity_keeps_every_stage_on_the_first_stage_engine() -> None:
    # Oracle router: jobs the fast model fails go slow when the slack allows; all stages follow.
    res = simulate(JOBS, SimConfig(("fast", "slow"), 5.0, "chimera-oracle-router", tau=1e6), SPECS)
    assert {w.model for w in res.workflows} <= {"fast", "slow"}
    s = summarize(res)
    assert s.workflows == len(JOBS)
    assert sum(s.share.values()) == pytest.approx(1.0)


def test_stjf_serves_the_short_job_first_on_a_full_engine() -> None:
    one_seat = {"fast": EngineSpec(FAST, kv_tokens=100_000, max_num_seqs=1)}
    jobs = [_job(0, (500,)), _job(1, (400,)), _job(2, (10,))]
    by_variant = {}
    for v in ("vllm", "vllm-stjf"):
        res = simulate(jobs, SimConfig(("fast",), 1000.0, v, seed=1), one_seat)
        by_variant[v] = {w.job: w.e2e_s for w in res.workflows}
    # All arrive within milliseconds; the first admitted runs alone. FCFS then serves job 1 before job 2,
    # STJF the 10-token job 2 first.
    assert by_variant["vllm-stjf"][2] < by_variant["vllm-stjf"][1]
    assert by_variant["vllm"][2] > by_variant["vllm"][1]


def test_kv_pressure_preempts_and_still_finishes_everything() -> None:
    tight = {"fast": EngineSpec(FAST, kv_tokens=1_000, max_num_seqs=4)}
    jobs = [_job(i, (300, 200)) for i in range(6)]
    res = simulate(jobs, SimConfig(("fast",), 50.0, "vllm-stjf"), tight)
    assert res.preemptions > 0
    assert sorted(w.job for w in res.workflows) == list(range(6))
    assert all(w.tokens == 500 for w in res.workflows)


def test_summary_metrics() -> None:
    s = summarize(simulate(JOBS, SimConfig(("fast", "slow"), 20.0, "vllm"), SPECS))
    assert s.e2e_p99_s >= s.e2e_mean_s > 0
    assert s.latency_per_token_ms > 0 and 0.0 <= s.score <= 1.0
    assert s.queue_mean_s >= 0


@pytest.mark.timeout(120)
def test_quick_sweep_smoke(tmp_path: Path) -> None:
    """A cut-down sweep through bench.sweep.run: real training, the simulator, tables, figures,
    frontier.json."""
    from bench.sweep import run as bench_run
    from bench.sweep.report import write_all

    pool, single = ("qwen1.5b+7b",), ("qwen2.5-7b",)
    mode = bench_run.Mode("smoke", ("math",), pool, (8,), (0, 1), single, (0.9,), 30, 120)
    data: dict[str, Any] = bench_run.sweep(mode, seed=5, cache=tmp_path / "cache")
    data["meta"] = {"command": "test", "seed": 5, "runtime_s": 0.0}
    (tmp_path / "frontier.json").write_text(json.dumps(data))
    write_all(data, tmp_path)
    cell = data["frontier"]["math"]["qwen1.5b+7b"]["8"]
    assert set(cell) >= {"vllm", "mlfq", "ltr", "vllm-stjf", "chimera", "chimera-plus"}
    assert set(cell["chimera"]) == {"0", "1"}
    for name in ("headline.md", "improved.md", "fig3.md", "fig5_math.png", "fig6_math.png", "fig3_math.png"):
        assert (tmp_path / name).stat().st_size > 0
    # Figure 3 is keyed by load; its RPS came from the model's capacity.
    assert set(data["fig3"]["math"]["qwen2.5-7b"]) == {"0.9"}
    assert 0.5 < data["fig3_capacity_rps"]["math"]["qwen2.5-7b"] < 20
    # bench.sweep.seeds aggregates sweeps: two copies of one seed give every cell's verdict twice.
    from bench.sweep import seeds

    imp = seeds.improved_cells([data, data])
    assert len(imp) == 1 and imp[0]["hv_paper"][0] == imp[0]["hv_paper"][1] > 0
    table, ge, _ = seeds.improved_md(imp)
    assert ge == (imp[0]["hv_plus"][0] >= imp[0]["hv_paper"][0]) and "qwen1.5b+7b" in table
    f3 = seeds.fig3_cells([data, data], "fig3")
    assert f3[0]["queue_s"]["vllm"][0] == data["fig3"]["math"]["qwen2.5-7b"]["0.9"]["vllm"]["queue_mean_s"]
    assert "qwen2.5-7b" in seeds.fig3_md(f3)[0]
