"""The router and the length predictor trained on REAL outcomes: ``python -m bench.learned.real``.

Reads the committed ``bench/data/real/`` (HumanEval workflows run on Qwen2.5-Coder-0.5B and -1.5B through the
stack, each answer verified; see its README.md) and writes ``bench/results/real.json`` and ``real.md``:

1. Split held out *by task*: the problem ids are shuffled (seeded) and cut into ``--folds`` folds; every run
   of a problem (any engine, any workflow) lands in the same fold, so no test problem was seen in training.
2. Per fold, the product's default backends are fitted on the other folds exactly as ``chimera train`` does
   (``make_backend("tfidf")`` router, ``make_backend("qrf")`` predictor) and scored on the held-out fold:
   router ``map`` is ``services.router.training.macro_map`` (per model, average precision of the predicted
   success probability; a model whose held-out labels are one class is left out), against ``prior_map``
   (the text-blind per-model success rate of the train part, the floor ``train_router`` reports) and
   ``prior_workflow_map`` (the per-workflow prior ``bench.learned.predictors`` uses). Predictor: Kendall-tau
   distance of the predicted median remaining tokens to the true order, with
   ``bench.learned.predictors.windowed_kendall`` (pairs of one program skipped), against FCFS (random arrival,
   ``arrival_positions``), the recorded enqueue times, and input length.
3. Real pass rates per engine (overall and per workflow) from ``runs.jsonl``, and the oracle headroom on the
   (problem, workflow) tasks run on both engines: "either passes" against each alone.

82 workflows is a small sample: each fold holds ~11 problems, so the per-fold figures swing widely; the
report gives every fold, the mean, the median and the min/max. Nothing here is tuned.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.paths import dataset_commit
from bench.learned.predictors import F64, arrival_positions, windowed_kendall
from bench.learned.real_merge import companions
from bench.learned.real_merge import markdown as companion_markdown
from services.collect.dataset import RunRecord, read_runs
from services.common.tokens import approx_tokens
from services.common.tracestore import read_trace_folder, remaining_tokens
from services.common.types import OutcomeRow, TraceRow
from services.predictor.backends import make_backend as make_predictor
from services.predictor.features import PredictorInput
from services.router.backends import make_backend as make_router
from services.router.backends import router_examples
from services.router.prior import PriorRouter
from services.router.training import macro_map

log = logging.getLogger("bench.learned.real")

COMMAND = "python -m bench.learned.real"
DATA = Path("bench/data/real")
TARGET_MARGIN = 0.10  # the target on code: map >= prior_map + 0.10
ROUTER_KEYS = ("map", "prior_map", "prior_workflow_map")
PREDICTOR_KEYS = (
    "kendall_tau_distance",
    "fcfs_distance",
    "fcfs_enqueued_distance",
    "input_length_distance",
)


@dataclass(frozen=True)
class RealData:
    traces: list[TraceRow]
    outcomes: list[OutcomeRow]
    runs: list[RunRecord]

    def problem_of(self) -> dict[str, str]:
        """program id -> problem id (from ``runs.jsonl``, which names both)."""
        return {r.program_id: r.problem_id for r in self.runs}


def load(folder: Path = DATA) -> RealData:
    """The folder as ``chimera train --traces`` reads it, plus ``runs.jsonl``."""
    traces, outcomes = read_trace_folder(folder)
    return RealData(traces, outcomes, read_runs(folder))


def problem_folds(problem_ids: Sequence[str], folds: int, seed: int) -> list[list[str]]:
    """Distinct problem ids, shuffled with ``seed`` and cut into ``folds`` near-equal disjoint folds."""
    ids = sorted(set(problem_ids))
    if not 2 <= folds <= len(ids):
        raise ValueError(f"folds must be in [2, {len(ids)}]")
    perm = np.random.default_rng(seed).permutation(len(ids))
    return [sorted(ids[i] for i in part) for part in np.array_split(perm, folds)]


def _stats(values: Sequence[float | None]) -> dict[str, float | int | None]:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"mean": None, "median": None, "min": None, "max": None, "std": None, "n": 0}
    a = np.asarray(vals, dtype=np.float64)
    return {
        "mean": float(a.mean()),
        "median": float(np.median(a)),
        "min": float(a.min()),
        "max": float(a.max()),
        "std": float(a.std()),
        "n": len(vals),
    }


def router_fold(
    train_out: list[OutcomeRow], test_out: list[OutcomeRow], traces: list[TraceRow]
) -> dict[str, Any]:
    examples = router_examples(traces, test_out)
    routers = {
        "map": make_router("tfidf"),
        "prior_map": PriorRouter(per_workflow=False),
        "prior_workflow_map": make_router("prior"),
    }
    out: dict[str, Any] = {"test_examples": len(examples)}
    for key, r in routers.items():
        r.fit(traces, train_out)
        score, per_model = macro_map(r, examples)
        out[key] = score
        out[f"{key}_per_model"] = per_model
    return out


def predictor_fold(
    train: list[TraceRow], test: list[TraceRow], truth: dict[str, int], window: int, seed: int
) -> dict[str, Any]:
    model = make_predictor("qrf")
    model.fit(train)
    pred = model.predict([PredictorInput.from_trace(r) for r in test], (0.5, 0.9))
    y = np.array([truth[r.request_id] for r in test], dtype=np.float64)
    per_model: dict[str, Any] = {}
    for d, m in enumerate(sorted({r.model for r in test})):
        idx = np.array([i for i, r in enumerate(test) if r.model == m])
        if len(idx) < 2:
            continue
        s = seed + 7919 * d
        group = [test[i].program_id for i in idx]
        keys: dict[str, F64] = {
            "kendall_tau_distance": pred[idx, 0],
            "fcfs_distance": arrival_positions(len(idx), s),
            "fcfs_enqueued_distance": np.array([test[i].enqueued_unix for i in idx], dtype=np.float64),
            "input_length_distance": np.array(
                [approx_tokens(test[i].prompt_text) for i in idx], dtype=np.float64
            ),
        }
        row: dict[str, Any] = {k: windowed_kendall(y[idx], v, group, window, s) for k, v in keys.items()}
        row["p90_coverage"] = float(np.mean(y[idx] <= pred[idx, 1]))
        row["test_rows"] = len(idx)
        per_model[m] = row
    summary = {k: _mean([r[k] for r in per_model.values()]) for k in PREDICTOR_KEYS}
    return {**summary, "test_rows": len(test), "per_model": per_model}


def _gain(fold: dict[str, Any], floor: str) -> float | None:
    a, b = fold["map"], fold[floor]
    return None if a is None or b is None else float(a - b)


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def pass_rates(runs: Sequence[RunRecord]) -> dict[str, Any]:
    """Per engine: verified pass rate overall and per workflow; oracle headroom on tasks run on both."""
    per: dict[str, Any] = {}
    by_engine: dict[str, list[RunRecord]] = defaultdict(list)
    for r in runs:
        by_engine[r.engine].append(r)
    for eng, rs in sorted(by_engine.items()):
        wf: dict[str, list[float]] = defaultdict(list)
        for r in rs:
            wf[r.workflow].append(float(r.score >= 0.5))
        passed = sum(float(r.score >= 0.5) for r in rs)
        per[eng] = {
            "model": rs[0].model,
            "workflows": len(rs),
            "passed": int(passed),
            "pass_rate": passed / len(rs),
            "per_workflow": {
                w: {"workflows": len(v), "passed": int(sum(v)), "pass_rate": float(np.mean(v))}
                for w, v in sorted(wf.items())
            },
        }
    task: dict[tuple[str, str], dict[str, bool]] = defaultdict(dict)
    for r in runs:
        task[r.problem_id, r.workflow][r.engine] = r.score >= 0.5
    engines = sorted(by_engine)
    both = [v for v in task.values() if len(v) == len(engines)]
    oracle: dict[str, Any] = {"tasks_on_all_engines": len(both)}
    if both and len(engines) > 1:
        for e in engines:
            oracle[f"{e}_pass_rate"] = float(np.mean([v[e] for v in both]))
        oracle["either_pass_rate"] = float(np.mean([any(v.values()) for v in both]))
        best = max(oracle[f"{e}_pass_rate"] for e in engines)
        oracle["headroom_over_best_single"] = oracle["either_pass_rate"] - best
    return {"per_engine": per, "oracle": oracle}


def evaluate(data: RealData, folds: int, seed: int, window: int) -> dict[str, Any]:
    problem_of = data.problem_of()
    outcomes = [o for o in data.outcomes if o.program_id in problem_of]
    traces = [t for t in data.traces if t.program_id in problem_of]
    truth = dict(zip((t.request_id for t in traces), remaining_tokens(traces), strict=True))
    parts = problem_folds([problem_of[o.program_id] for o in outcomes], folds, seed)
    rows: list[dict[str, Any]] = []
    for k, test_ids in enumerate(parts):
        held = set(test_ids)
        tr_out = [o for o in outcomes if problem_of[o.program_id] not in held]
        te_out = [o for o in outcomes if problem_of[o.program_id] in held]
        tr_rows = [t for t in traces if problem_of[t.program_id] not in held]
        te_rows = [t for t in traces if problem_of[t.program_id] in held]
        rows.append(
            {
                "fold": k,
                "test_problems": test_ids,
                "train_problems": sorted({problem_of[o.program_id] for o in tr_out}),
                "train_workflows": len(tr_out),
                "test_workflows": len(te_out),
                "router": router_fold(tr_out, te_out, traces),
                "predictor": predictor_fold(tr_rows, te_rows, truth, window, seed + k),
            }
        )
        log.info("fold %d: router %s, predictor %s", k, rows[-1]["router"]["map"], rows[-1]["predictor"])
    router = {key: _stats([f["router"][key] for f in rows]) for key in ROUTER_KEYS}
    for floor in ("prior_map", "prior_workflow_map"):
        router[f"gain_over_{floor.removesuffix('_map')}"] = _stats([_gain(f["router"], floor) for f in rows])
    predictor = {key: _stats([f["predictor"][key] for f in rows]) for key in PREDICTOR_KEYS}
    gain = router["gain_over_prior"]
    target = {
        "target": f"tfidf router map >= prior_map + {TARGET_MARGIN:.2f} on code (mean over folds)",
        "map_mean": router["map"]["mean"],
        "prior_map_mean": router["prior_map"]["mean"],
        "gain_mean": gain["mean"],
        "gain_median": gain["median"],
        "gain_min": gain["min"],
        "gain_over_prior_workflow_mean": router["gain_over_prior_workflow"]["mean"],
        "met": gain["mean"] is not None and gain["mean"] >= TARGET_MARGIN,
    }
    return {"folds": rows, "router": {"code": router}, "predictor": {"code": predictor}, "target": target}


def run(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    data = load(args.data)
    result: dict[str, Any] = {
        "command": COMMAND,
        "config": {"folds": args.folds, "seed": args.seed, "window": args.window, "data": str(args.data)},
        "dataset_commit": dataset_commit(args.data),
        "counts": counts(data),
        "backends": {
            "router": "tfidf",
            "predictor": "qrf",
            "prior": "per-model success rate of the train part",
        },
        "small_sample": (
            f"{len(data.runs)} verified workflows on {len({r.problem_id for r in data.runs})} problems: a"
            " small sample. Each held-out fold has a handful of problems, so per-fold figures swing widely;"
            " read the spread across folds, not one number."
        ),
        "pass_rates": pass_rates(data.runs),
    }
    result |= evaluate(data, args.folds, args.seed, args.window)
    result["elapsed_s"] = time.perf_counter() - t0
    return result


def counts(data: RealData) -> dict[str, Any]:
    per: dict[str, dict[str, int]] = {}
    for eng in sorted({r.engine for r in data.runs}):
        rs = [r for r in data.runs if r.engine == eng]
        per[eng] = {
            "workflows": len(rs),
            "problems": len({r.problem_id for r in rs}),
            "stages": sum(1 for t in data.traces if t.engine == eng),
        }
    return {
        "workflows": len(data.runs),
        "problems": len({r.problem_id for r in data.runs}),
        "outcomes": len(data.outcomes),
        "trace_rows": len(data.traces),
        "per_engine": per,
    }


def _f(v: Any) -> str:
    return "–" if v is None else f"{v:.3f}"


def write_markdown(result: dict[str, Any], path: Path) -> None:
    c, cfg = result["counts"], result["config"]
    r, p, t = result["router"]["code"], result["predictor"]["code"], result["target"]
    lines = [
        "# Router and predictor on real outcomes (`bench/data/real/`)",
        "",
        f"Written by `{result['command']}` (`make bench-real`) in {result['elapsed_s']:.0f} s. Dataset commit"
        f" `{result['dataset_commit']}`: {c['workflows']} verified HumanEval workflows on {c['problems']}"
        f" problems ({c['trace_rows']} stages); "
        + ", ".join(
            f"{e} {v['workflows']} workflows / {v['problems']} problems" for e, v in c["per_engine"].items()
        )
        + ".",
        "",
        f"**Small sample.** {result['small_sample']} {cfg['folds']}-fold split held out by problem id"
        f" (seed {cfg['seed']}); tf-idf router and QRF predictor, the product's defaults, fitted per fold on"
        " the other folds. All data is code.",
        "",
        f"**Target** ({t['target']}): **{'met' if t['met'] else 'not met'}**: map {_f(t['map_mean'])} vs"
        f" prior_map {_f(t['prior_map_mean'])}, gain {_f(t['gain_mean'])} (median {_f(t['gain_median'])}, min"
        f" {_f(t['gain_min'])}). Against the per-workflow prior the gain is"
        f" {_f(t['gain_over_prior_workflow_mean'])}.",
        "",
        "## Across folds",
        "",
        "| metric | mean | median | min | max | folds |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in [
        *((f"router {k}", r[k]) for k in (*ROUTER_KEYS, "gain_over_prior", "gain_over_prior_workflow"))
    ] + [(f"predictor {k}", p[k]) for k in PREDICTOR_KEYS]:
        lines.append(
            f"| {name} | {_f(s['mean'])} | {_f(s['median'])} | {_f(s['min'])} | {_f(s['max'])} | {s['n']} |"
        )
    lines += [
        "",
        "Router: macro mAP over the two models (`services.router.training.macro_map`, higher is better)."
        " `prior_map` is the text-blind per-model success rate of the train part (the floor `train_router`"
        " reports, and the one the target names); `prior_workflow_map` is the per-workflow prior"
        " `bench.learned.predictors` uses, a stricter floor: the tf-idf router also sees the workflow type,"
        " and the pass rates differ a lot by workflow here, so much of its gain over `prior_map` is the"
        " workflow."
        " Predictor: Kendall-tau distance (`bench.learned.predictors.windowed_kendall`, lower is better, 0.5"
        " is random; pairs of one program skipped); `fcfs` is a random arrival order, `fcfs_enqueued` the"
        " recorded enqueue times.",
        "",
        "## Per fold",
        "",
        "| fold | test problems | test workflows | map | prior_map | prior_workflow_map | KT qrf | KT fcfs |"
        " KT enqueued | KT input length |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in result["folds"]:
        fr, fp = f["router"], f["predictor"]
        lines.append(
            f"| {f['fold']} | {len(f['test_problems'])} | {f['test_workflows']} | {_f(fr['map'])} |"
            f" {_f(fr['prior_map'])} | {_f(fr['prior_workflow_map'])} | {_f(fp['kendall_tau_distance'])} |"
            f" {_f(fp['fcfs_distance'])} | {_f(fp['fcfs_enqueued_distance'])} |"
            f" {_f(fp['input_length_distance'])} |"
        )
    pr = result["pass_rates"]
    lines += [
        "",
        "## Real pass rates (runs.jsonl)",
        "",
        "| engine | model | workflow | passed | rate |",
        "|---|---|---|---|---|",
    ]
    for e, v in pr["per_engine"].items():
        lines.append(f"| {e} | {v['model']} | all | {v['passed']}/{v['workflows']} | {v['pass_rate']:.3f} |")
        for w, s in v["per_workflow"].items():
            lines.append(f"| {e} | | {w} | {s['passed']}/{s['workflows']} | {s['pass_rate']:.3f} |")
    o = pr["oracle"]
    lines += [
        "",
        f"Oracle on the {o['tasks_on_all_engines']} (problem, workflow) tasks run on both engines: ",
    ]
    if "either_pass_rate" in o:
        alone = ", ".join(
            f"{k.removesuffix('_pass_rate')} {v:.3f}"
            for k, v in o.items()
            if k.endswith("_pass_rate") and k != "either_pass_rate"
        )
        lines[-1] += (
            f"either passes {o['either_pass_rate']:.3f} vs {alone} alone (headroom over the best single"
            f" engine {o['headroom_over_best_single']:.3f})."
        )
    lines += companion_markdown(result)
    path.write_text("\n".join(lines) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=int, default=64, help="requests per Kendall comparison set")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = run(args)
    result |= companions(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "real.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    write_markdown(result, args.out / "real.md")
    log.info("wrote %s in %.1f s", args.out / "real.json", result["elapsed_s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
