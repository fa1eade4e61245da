"""Summaries of the live runs, and the simulator's prediction for the same trace on the same pool.

NOTE(live sim): ``bench.sweep.sim`` is the instrument, run as it is: nothing here is fitted to the live
figures. What it is fed comes from the live stack and this trace only:

- engines: each engine's profile as measured by its worker and read from Redis (decode step curve, prefill
  cost), the pool's ``max_num_seqs`` and the KV tokens its configured cache holds (``kv_tokens``);
- jobs: every task of the trace with, per model, its stages' prompt and output tokens and its verified
  score as that model's "alone" run produced them, and the dispatcher's ŷ for each stage from the same run;
- router confidences: the router the live stack served, asked about each task's first-stage text;
- arrivals: the trace's offsets; pins: the same as the live policy's.

Two predicted scores are given: ``score`` (each task scores what it scored alone on the model the simulator
routes it to) and ``score_at_rates`` (each routed task scores that model's measured alone pass rate: the
per-model success rates alone, blind to which task went where).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.live.plan import WORKFLOW, LivePolicy
from bench.live.policy import PolicyRun, WorkflowRecord
from bench.sweep.sim import EngineSpec, SimConfig, simulate
from bench.sweep.workload import Job, Run, Stage
from services.common.types import EngineProfile
from services.policy.knobs import DEFAULT_KNOBS

NO_KV_LIMIT = 1 << 40


@dataclass(frozen=True, slots=True)
class Outcome:
    """One policy's figures, live or simulated (latencies in seconds)."""

    workflows: int
    score: float
    e2e_p50_s: float
    e2e_mean_s: float
    share: Mapping[str, float]  # model -> share of workflows it served
    queue_mean_s: Mapping[str, float]  # model -> mean queue wait of its stage requests
    score_at_rates: float | None = None  # simulator only (see the module docstring)
    failed: int = 0  # live only: workflows that did not complete (counted as score 0)


def kv_tokens(config_json: Path, kv_gib: float) -> int:
    """Tokens a ``kv_gib`` bf16 KV cache holds for the model: K and V, every layer, every KV head."""
    cfg = json.loads(config_json.read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 2
    return int(kv_gib * (1 << 30) // per_token)


def _share(models: Sequence[str]) -> dict[str, float]:
    return {m: models.count(m) / len(models) for m in sorted(set(models))}


def live_outcome(run: PolicyRun) -> Outcome:
    done = [w for w in run.workflows if not w.error]
    e2e = [w.e2e_s for w in done] or [0.0]
    queues: dict[str, list[float]] = {}
    for w in done:
        for s in w.stages:
            queues.setdefault(s.model, []).append(s.queue_wait_s)
    return Outcome(
        workflows=len(run.workflows),
        score=sum(w.score or 0.0 for w in run.workflows) / len(run.workflows),
        e2e_p50_s=statistics.median(e2e),
        e2e_mean_s=statistics.fmean(e2e),
        share=_share([w.model for w in done]),
        queue_mean_s={m: statistics.fmean(v) for m, v in sorted(queues.items())},
        failed=len(run.workflows) - len(done),
    )


def passed(run: PolicyRun) -> list[bool]:
    return [w.score is not None and w.score >= 1.0 for w in run.workflows]


def _usable(w: WorkflowRecord) -> bool:
    return not w.error and w.score is not None and len(w.stages) == 2


def sim_jobs(
    alone: Mapping[str, PolicyRun], confidences: Sequence[Mapping[str, float]]
) -> tuple[list[Job], list[int]]:
    """One job per task that completed in every model's alone run; the indices of the tasks left out."""
    n = len(confidences)
    jobs, skipped = [], []
    for i in range(n):
        recs = [run.workflows[i] for run in alone.values()]
        if not all(_usable(w) for w in recs):
            skipped.append(i)
            continue
        runs = {}
        for w in recs:
            outs = [s.completion_tokens for s in w.stages]
            stages = tuple(
                Stage(s.prompt_tokens, s.completion_tokens, s.predicted_tokens, 0, sum(outs[k:]))
                for k, s in enumerate(w.stages)
            )
            score = float(w.score or 0.0)
            runs[w.model] = Run(stages, score, score >= 1.0)
        q_oracle = {m: float(r.success) for m, r in runs.items()}
        jobs.append(Job(i, WORKFLOW, runs, dict(confidences[i]), {}, q_oracle))
    return jobs, skipped


def sim_specs(
    profiles: Mapping[str, str], kv: Mapping[str, int | None], seqs: Mapping[str, int]
) -> dict[str, EngineSpec]:
    """Keyed by model name (the simulator's engines are its models). An engine without a KV cache of its own
    (a simulated one: ``kv`` None) is given one that never fills."""
    return {
        m: EngineSpec(EngineProfile.from_json(profiles[m]), kv[m] or NO_KV_LIMIT, seqs[m]) for m in profiles
    }


def sim_outcome(
    policy: LivePolicy,
    jobs: Sequence[Job],
    specs: Mapping[str, EngineSpec],
    pool: Sequence[str],
    arrivals: Sequence[float],
    pins: Sequence[str],
    rate: float,
    pass_rate: Mapping[str, float],
) -> Outcome:
    tau = policy.tau if policy.dispatcher_policy.startswith("chimera") else DEFAULT_KNOBS.tau
    config = SimConfig(tuple(pool), rate, policy.sim_variant, tau=tau)
    res = simulate(
        jobs,
        config,
        specs,
        arrivals_s=[arrivals[j.index] for j in jobs],
        pin_of=lambda job: pins[job.index] or None,
    )
    wf = res.workflows
    e2e = [w.e2e_s for w in wf]
    by_model: dict[str, list[float]] = {}
    for w in wf:
        by_model.setdefault(w.model, []).extend(w.queue_s)
    return Outcome(
        workflows=len(wf),
        score=sum(w.score for w in wf) / len(wf),
        e2e_p50_s=statistics.median(e2e),
        e2e_mean_s=statistics.fmean(e2e),
        share=_share([w.model for w in wf]),
        queue_mean_s={m: statistics.fmean(v) for m, v in sorted(by_model.items()) if v},
        score_at_rates=sum(pass_rate[w.model] for w in wf) / len(wf),
    )


def diff(live: Outcome, sim: Outcome) -> dict[str, Any]:
    """Live minus simulated; latencies also relative to the simulated figure."""
    return {
        "score": live.score - sim.score,
        "score_vs_rates": None if sim.score_at_rates is None else live.score - sim.score_at_rates,
        "e2e_p50_s": live.e2e_p50_s - sim.e2e_p50_s,
        "e2e_mean_s": live.e2e_mean_s - sim.e2e_mean_s,
        "e2e_mean_rel": (live.e2e_mean_s - sim.e2e_mean_s) / sim.e2e_mean_s if sim.e2e_mean_s else None,
        "e2e_p50_rel": (live.e2e_p50_s - sim.e2e_p50_s) / sim.e2e_p50_s if sim.e2e_p50_s else None,
    }
