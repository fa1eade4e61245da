"""Fairness across tenants: does a tenant flooding the pool hurt another tenant's queue wait?

Usage: ``python -m bench.sweep.fairness`` (``make bench-fairness``, seconds) writes ``results/fairness.json``
and ``results/fairness.md``.

NOTE(setup): the simulator (``bench.sweep.sim``) runs the product's own queue order: every stage goes through
``services.policy.ledger.Ledger`` with its tenant and weight, so it gets the fairness term the dispatcher's
ENQUEUE gets (``services.policy.fairness``), with the product's knobs. One engine serves two tenants that
send the same kind of workflow (three stages; output lengths log-normal, the prediction ŷ the truth times
log-normal noise, as a learned predictor errs). Tenant B sends workflows at ``b_load`` of the engine's
capacity; tenant A sends ten times as many, for the same ``window_s``, so the engine is overloaded while A
sends. The figure is B's queue wait per stage (enqueue to claim), p99 over every B stage of every seed,
in three runs on the very same B arrivals: B alone; A and B with fairness (the default
``fair_cap_tokens``); A and B without it (``fair_cap_tokens`` 0), which is what the queue did before tenants.

What the simulator does not have: the dispatcher's admission bound (``max_queue_s``) and the tenants'
quotas, which would refuse most of A's flood with 429 before it reached the queue. Without them the flood
is worse here than on a real stack: this measures the queue order alone.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common.paths import RESULTS
from bench.sweep.sim import EngineSpec, SimConfig, simulate
from bench.sweep.workload import Job, Run, Stage
from services.common.types import EngineProfile
from services.policy.knobs import DEFAULT_KNOBS

MODEL = "m"
SPEC = EngineSpec(
    EngineProfile(decode_ms_per_token=20.0, max_batch_size=8, prefill_ms_per_token=0.05,
                  step_ms=((1, 20.0), (8, 26.0))),
    kv_tokens=1_000_000,
    max_num_seqs=8,
)  # fmt: skip
STAGES = 3
MEAN_OUTPUT = 150.0
PROMPT_TOKENS = 400


FLOOR = (
    "Why the fair rows stay above B alone: the queue order puts B's waiting stages ahead of A's flood (B's "
    "median wait is 0, as alone, against minutes without the term), but a stage is never taken off a slot: "
    "a B stage that arrives while A's stages hold every slot waits for one of them to finish, which B alone "
    "never does. That floor is the claim side's (how many slots one tenant may hold, or preemption), not the "
    "queue order's; the fairness term cannot remove it."
)


@dataclass(frozen=True, slots=True)
class Setup:
    b_loads: tuple[float, ...] = (0.5, 0.8, 1.0)  # B's offered load, as fractions of the engine's capacity
    a_times_b: float = 10.0
    window_s: float = 150.0  # how long both tenants send
    seeds: tuple[int, ...] = (1, 2, 3, 4, 5)
    weight_a: int = 1
    weight_b: int = 1


def _stage_s() -> float:
    """Mean seconds one stage holds a slot at a full batch: the engine's capacity is slots / this."""
    return MEAN_OUTPUT * SPEC.profile.step_time_ms(SPEC.max_num_seqs) / 1000.0


def capacity_wps() -> float:
    """Workflows per second one engine completes at a full batch."""
    return SPEC.max_num_seqs / (_stage_s() * STAGES)


def _job(index: int, rng: random.Random) -> Job:
    sigma = 0.6
    outs = [
        max(1, int(rng.lognormvariate(math.log(MEAN_OUTPUT) - sigma**2 / 2, sigma))) for _ in range(STAGES)
    ]
    stages = []
    for s in range(STAGES):
        remaining = sum(outs[s:])
        noisy = max(1, int(remaining * rng.lognormvariate(0.0, 0.5)))
        stages.append(Stage(PROMPT_TOKENS + 100 * s, outs[s], noisy, noisy // (STAGES - s), remaining))
    q = {MODEL: 1.0}
    return Job(index, "synthetic", {MODEL: Run(tuple(stages), 1.0, True)}, q, q, q)


def _poisson(rate: float, window_s: float, rng: random.Random) -> list[float]:
    out, t = [], rng.expovariate(rate)
    while t < window_s:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def _p(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def run_case(setup: Setup, b_load: float, seed: int, with_a: bool, fair_cap: int) -> list[float]:
    """B's queue waits (s) per stage in one run."""
    rng = random.Random(seed)
    rate_b = b_load * capacity_wps()
    arrivals = [(t, "b") for t in _poisson(rate_b, setup.window_s, rng)]
    a_times = _poisson(rate_b * setup.a_times_b, setup.window_s, rng)  # drawn either way: same B jobs
    if with_a:
        arrivals += [(t, "a") for t in a_times]
    arrivals.sort()
    jobs = [_job(i, rng) for i in range(len(arrivals))]
    tenant = {j.index: arrivals[j.index][1] for j in jobs}
    weights = {"a": setup.weight_a, "b": setup.weight_b}
    cfg = SimConfig((MODEL,), 1.0, "chimera", seed=seed, fair_cap=fair_cap)
    res = simulate(
        jobs,
        cfg,
        {MODEL: SPEC},
        tenant_of=lambda j: (tenant[j.index], weights[tenant[j.index]]),
        arrivals_s=[t for t, _ in arrivals],
    )
    return [q for w in res.workflows if tenant[w.job] == "b" for q in w.queue_s]


def measure_load(setup: Setup, b_load: float) -> dict[str, Any]:
    cases = {
        "b_alone": (False, DEFAULT_KNOBS.fair_cap_tokens),
        "a_and_b_fair": (True, DEFAULT_KNOBS.fair_cap_tokens),
        "a_and_b_unfair": (True, 0),
    }
    rows: dict[str, Any] = {}
    for name, (with_a, cap) in cases.items():
        waits = [q for seed in setup.seeds for q in run_case(setup, b_load, seed, with_a, cap)]
        rows[name] = {
            "b_stages": len(waits),
            "b_wait_p50_s": round(_p(waits, 0.50), 3),
            "b_wait_p99_s": round(_p(waits, 0.99), 3),
            "b_wait_mean_s": round(sum(waits) / len(waits), 3),
            "fair_cap_tokens": cap,
        }
    alone = rows["b_alone"]["b_wait_p99_s"]
    for name in ("a_and_b_fair", "a_and_b_unfair"):
        rows[name]["p99_vs_alone"] = round(rows[name]["b_wait_p99_s"] / alone, 2) if alone > 0 else None
    ratio = rows["a_and_b_fair"]["p99_vs_alone"]
    return {"b_load": b_load, "rows": rows, "p99_within_1_5x": ratio is not None and ratio <= 1.5}


def measure(setup: Setup) -> dict[str, Any]:
    return {
        "setup": asdict(setup),
        "engine": {"max_num_seqs": SPEC.max_num_seqs, "capacity_workflows_per_s": round(capacity_wps(), 3)},
        "knobs": {"aging_rate": DEFAULT_KNOBS.aging_rate, "fair_cap_tokens": DEFAULT_KNOBS.fair_cap_tokens},
        "loads": [measure_load(setup, b) for b in setup.b_loads],
    }


def markdown(out: dict[str, Any]) -> str:
    s = out["setup"]
    lines = [
        "# Fairness: tenant B's queue wait while tenant A floods",
        "",
        f"One simulated engine ({out['engine']['max_num_seqs']} slots, "
        f"{out['engine']['capacity_workflows_per_s']} three-stage workflows/s at a full batch). B offers "
        "the load in the first column (a fraction of that capacity); "
        f"A offers {s['a_times_b']:g}× B's rate, both for {s['window_s']:g} s; "
        f"weights A {s['weight_a']}, B {s['weight_b']}; seeds {list(s['seeds'])}, the same B arrivals in "
        "every row. Regenerate: `make bench-fairness` (`python -m bench.sweep.fairness`; "
        "`bench/sweep/fairness.py` says what is simulated).",
        "",
        "| B load | run | B stages | B wait p50 s | B wait p99 s | p99 vs B alone |",
        "|---|---|---|---|---|---|",
    ]
    for load in out["loads"]:
        for name, r in load["rows"].items():
            ratio = "" if "p99_vs_alone" not in r else f"{r['p99_vs_alone']}×"
            lines.append(
                f"| {load['b_load']:g} | {name} (fair_cap_tokens {r['fair_cap_tokens']}) | {r['b_stages']} | "
                f"{r['b_wait_p50_s']} | {r['b_wait_p99_s']} | {ratio} |"
            )
    lines.append("")
    for load in out["loads"]:
        verdict = "within" if load["p99_within_1_5x"] else "NOT within"
        lines.append(f"- B at {load['b_load']:g}: with fairness, B's p99 is {verdict} 1.5× of B alone.")
    lines += ["", FLOOR]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    d = Setup()
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--b-loads", type=float, nargs="+", default=list(d.b_loads))
    ap.add_argument("--window-s", type=float, default=d.window_s)
    ap.add_argument("--seeds", type=int, nargs="+", default=list(d.seeds))
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    out = measure(Setup(b_loads=tuple(args.b_loads), window_s=args.window_s, seeds=tuple(args.seeds)))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fairness.json").write_text(json.dumps(out, indent=2) + "\n")
    (args.out / "fairness.md").write_text(markdown(out))
    print(markdown(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
