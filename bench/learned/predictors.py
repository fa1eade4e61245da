"""Benchmark of the learned router and length predictor on generated traces: ``python -m
bench.learned.predictors``.

Writes ``bench/results/predictors.json`` and ``bench/results/predictors.md``. Steps:

1. Traces: the real prompt corpus (``services.workload.corpus``), ``--draws`` (problem, workflow) draws, each
   run on the paper's six models by the outcome model (``services.workload.generate``), exactly the rows live
   workers record. Held-out split *by task*: a hash of the task text puts every run of a problem (any model,
   any workflow, any draw) on the same side, so test tasks were never seen in training.
2. Router, per dataset and model: average precision of the learned backend(s), of the text-blind ``prior``
   backend (per-workflow success rates: the floor), and of the outcome model's own success probability
   (the ceiling). ``observable_map`` is a diagnostic: a logistic head given the problem's true difficulty
   and length, the observable part of what the outcome model uses; no deployed router has those.
3. Predictor, per dataset and model: Kendall-tau distance to the true order of total remaining output
   tokens, for the QRF median, the outcome model's own conditional median (the ceiling), FCFS and input
   length. See ``windowed_kendall`` for the comparison set. ``observable_distance`` is the same kind of
   diagnostic as ``observable_map``: the QRF given the problem's true difficulty as one more feature.
4. Calibration: mean and std of total workflow tokens per model and dataset next to the targets, on a
   separate, larger sample (``--calibration-draws`` per dataset): the small models' tails are so heavy
   (std 4x the mean) that the training draws alone would give a mean uncertain by 15% or more.
5. Serving latency: both services started as real processes (``python -m services.router`` / ``.predictor``)
   on loopback serving the artifacts trained here; one client calling in a closed loop (see ``latency``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score

from bench.learned.predictors_report import CEILING_MARGIN, targets
from bench.learned.predictors_serving import latency_section
from services.common import artifacts
from services.common.tokens import approx_tokens
from services.common.tracestore import remaining_tokens
from services.predictor.backends import make_backend as make_predictor
from services.predictor.features import ConcatFeatures, PredictorInput
from services.predictor.qrf import QrfPredictor
from services.router.backends import RouterBackend
from services.router.backends import make_backend as make_router
from services.workload.corpus import Problem, load_corpus
from services.workload.generate import Program, bindings_for, generate
from services.workload.models import MODELS, PUBLISHED_LENGTHS, resolve_model, target_for
from services.workload.outcome import OutcomeModel
from services.workload.workflows import workflows_for

log = logging.getLogger("bench.learned.predictors")

COMMAND = "python -m bench.learned.predictors"
DOMAINS = ("code", "math")
# Paper §7.6 Table 3, QRF Kendall-tau distance (APPS, MATH); §7.5 Table 2 (ModernBERT-large); §7.6 gain.
PAPER_QRF = {
    "qwen2.5-1.5b": (0.207, 0.146),
    "qwen2.5-3b": (0.139, 0.195),
    "qwen2.5-7b": (0.124, 0.185),
    "qwen2.5-14b": (0.129, 0.222),
    "llama-3.2-3b": (0.270, 0.254),
    "ministral-8b": (0.220, 0.154),
}
PAPER_ROUTER_MAP = {"code": 0.521, "math": 0.740}
PAPER_GAIN_OVER_FCFS = 0.314
CALIBRATION_TOLERANCE = 0.15
F64 = npt.NDArray[np.float64]


def is_test_task(text: str, fraction: float) -> bool:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64 < fraction


def windowed_kendall(true: F64, key: F64, group: Sequence[str], window: int, seed: int) -> float | None:
    """Kendall-tau distance counted only inside realistic comparison sets.

    A scheduler only ever orders requests that wait in one engine's queue at the same time, so comparing a
    request with every other one of the test set would overstate what ordering buys. The held-out requests of
    one model and dataset are put in a random arrival order (seeded; arrival is independent of length in the
    generated traces, as it is for independent users), cut into consecutive windows of ``window`` requests,
    a queue's worth under load, and only pairs in the same window count. Pairs of the same program
    (``group``) are skipped: its stages run one after another and never wait together. Pairs tied in the
    true value are skipped, ties in ``key`` count half. Returns wrong pairs / counted pairs.
    """
    n = len(true)
    perm = np.random.default_rng(seed).permutation(n)
    groups = np.array(group)
    wrong = pairs = 0.0
    for start in range(0, n, window):
        idx = perm[start : start + window]
        dt = np.sign(true[idx][:, None] - true[idx][None, :])
        dk = np.sign(key[idx][:, None] - key[idx][None, :])
        g = groups[idx]
        mask = np.triu(np.ones(dt.shape, dtype=bool), 1) & (dt != 0) & (g[:, None] != g[None, :])
        wrong += float(((dt * dk < 0) + 0.5 * (dk == 0))[mask].sum())
        pairs += float(mask.sum())
    return wrong / pairs if pairs else None


def arrival_positions(n: int, seed: int) -> F64:
    """The FCFS key matching ``windowed_kendall``'s arrival order (same seed, same permutation)."""
    out = np.empty(n, dtype=np.float64)
    out[np.random.default_rng(seed).permutation(n)] = np.arange(n, dtype=np.float64)
    return out


def _domain(workflow: str) -> str:
    return workflow.split("/", 1)[0]


def _ap(labels: Sequence[bool], scores: Sequence[float] | F64) -> float | None:
    y = np.asarray(labels, dtype=np.int8)
    return None if y.min() == y.max() else float(average_precision_score(y, np.asarray(scores)))


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def _observable_scores(problems: dict[str, Problem], train: list[Program], test: list[Program]) -> F64:
    """Per-model logistic heads on (true difficulty, log length, workflow): the diagnostic described above."""
    workflows = sorted({p.outcome.workflow for p in train})

    def feats(ps: list[Program]) -> F64:
        rows = [
            [problems[p.detail.problem_id].difficulty, np.log1p(approx_tokens(p.traces[0].user_text))]
            + [float(p.outcome.workflow == w) for w in workflows]
            for p in ps
        ]
        return np.asarray(rows, dtype=np.float64)

    out = np.zeros(len(test), dtype=np.float64)
    for m in {p.detail.model for p in test}:
        tr = [p for p in train if p.detail.model == m]
        idx = [i for i, p in enumerate(test) if p.detail.model == m]
        head = LogisticRegression(C=10.0, max_iter=1000).fit(feats(tr), [p.detail.success for p in tr])
        out[idx] = head.predict_proba(feats([test[i] for i in idx]))[:, 1]
    return out


class _TrueDifficulty:
    """Diagnostic feature: the corpus difficulty of the task (metadata no request carries)."""

    names = ("true_difficulty",)

    def __init__(self, by_text: dict[str, float]) -> None:
        self.by_text = by_text

    def fit(self, rows: Sequence[PredictorInput]) -> None:
        return None

    def transform(self, rows: Sequence[PredictorInput]) -> F64:
        return np.array([[self.by_text.get(r.user_text, 0.5)] for r in rows], dtype=np.float64)


def router_section(
    routers: dict[str, RouterBackend], prior: RouterBackend, observable: F64, test: list[Program]
) -> dict[str, Any]:
    texts = [p.traces[0].user_text for p in test]
    workflows = [p.outcome.workflow for p in test]
    column = {m: j for j, m in enumerate(prior.models)}
    # Every task ran on every model: score each distinct (task, workflow) once (encoders are slow).
    keys = sorted(set(zip(texts, workflows, strict=True)))
    index = {k: i for i, k in enumerate(keys)}
    at = np.array([index[k] for k in zip(texts, workflows, strict=True)])
    unique_texts, unique_workflows = [t for t, _ in keys], [w for _, w in keys]
    scored = {name: r.predict_proba(unique_texts, unique_workflows)[at] for name, r in routers.items()}
    prior_p = prior.predict_proba(texts, workflows)
    out: dict[str, Any] = {}
    for dom in DOMAINS:
        per_model: dict[str, Any] = {}
        for spec in MODELS:
            idx = [
                i for i, p in enumerate(test) if _domain(workflows[i]) == dom and p.detail.model == spec.key
            ]
            if not idx:
                continue
            labels = [test[i].detail.success for i in idx]
            row: dict[str, Any] = {"test_tasks": len(idx), "success_rate": float(np.mean(labels))}
            for name, r in routers.items():
                j = {m: k for k, m in enumerate(r.models)}[test[idx[0]].outcome.model]
                row["map" if name == "tfidf" else f"map_{name}"] = _ap(labels, scored[name][idx, j])
            row["prior_map"] = _ap(labels, prior_p[idx, column[test[idx[0]].outcome.model]])
            row["ceiling_map"] = _ap(labels, [test[i].detail.p_success for i in idx])
            row["observable_map"] = _ap(labels, observable[idx])
            per_model[spec.key] = row
        keys = sorted({k for row in per_model.values() for k in row if "map" in k})
        summary = {k: _mean([row.get(k) for row in per_model.values()]) for k in keys}
        out[dom] = {**summary, "paper_map": PAPER_ROUTER_MAP[dom], "per_model": per_model}
    return out


def predictor_section(
    predict: Any, observable: Any, test: list[Program], window: int, seed: int
) -> dict[str, Any]:
    rows = [t for p in test for t in p.traces]
    truth = np.asarray(remaining_tokens(rows), dtype=np.float64)
    inputs = [PredictorInput.from_trace(r) for r in rows]
    pred = predict(inputs, (0.5, 0.9))
    pred_observable = observable(inputs, (0.5,))
    out: dict[str, Any] = {}
    for dom in DOMAINS:
        per_model: dict[str, Any] = {}
        for d, spec in enumerate(MODELS):
            idx = np.array(
                [
                    i
                    for i, r in enumerate(rows)
                    if _domain(r.workflow) == dom and r.extra["stand_in"] == spec.key
                ]
            )
            if len(idx) < 2:
                continue
            s = seed + 7919 * d + (0 if dom == "code" else 1)
            group = [rows[i].program_id for i in idx]
            keys: dict[str, F64] = {
                "kendall_tau_distance": pred[idx, 0],
                "ceiling_distance": np.array(
                    [rows[i].extra["median_remaining"] for i in idx], dtype=np.float64
                ),
                "fcfs_distance": arrival_positions(len(idx), s),
                "observable_distance": pred_observable[idx, 0],
                "input_length_distance": np.array(
                    [approx_tokens(rows[i].prompt_text) for i in idx], dtype=np.float64
                ),
            }
            row: dict[str, Any] = {
                k: windowed_kendall(truth[idx], v, group, window, s) for k, v in keys.items()
            }
            row["all_pairs_distance"] = windowed_kendall(truth[idx], pred[idx, 0], group, len(idx), s)
            row["p90_coverage"] = float(np.mean(truth[idx] <= pred[idx, 1]))
            row["test_requests"] = len(idx)
            row["paper_qrf"] = PAPER_QRF[spec.key][DOMAINS.index(dom)]
            gap = row["kendall_tau_distance"] - row["ceiling_distance"]
            row["gap_to_ceiling"] = gap  # context: the outcome model's own ceiling (hidden factors included)
            row["within_margin_of_ceiling"] = bool(gap <= CEILING_MARGIN)
            per_model[spec.key] = row
        keys_ = (
            "kendall_tau_distance",
            "ceiling_distance",
            "fcfs_distance",
            "input_length_distance",
            "observable_distance",
        )
        summary = {k: _mean([r[k] for r in per_model.values()]) for k in keys_}
        out[dom] = {**summary, "per_model": per_model}
    return out


def calibration_section(
    problems: Sequence[Problem], model: OutcomeModel, draws: int, seed: int
) -> dict[str, Any]:
    totals: dict[tuple[str, str], list[int]] = defaultdict(list)
    for dom in DOMAINS:
        # Same recipe as the targets: a problem of the dataset uniformly, then one of its workflows uniformly.
        for p in generate(problems, model, bindings_for(model.models), draws, seed, workflows_for(dom)):
            totals[p.detail.model, dom].append(p.detail.total_tokens)
    published = {(k, d): (m, s) for k, d, m, s in PUBLISHED_LENGTHS}
    out: dict[str, Any] = {}
    for dom in DOMAINS:
        per_model: dict[str, Any] = {}
        for spec in MODELS:
            t = np.asarray(totals.get((spec.key, dom), []), dtype=np.float64)
            if not len(t):
                continue
            target = target_for(resolve_model(spec.key), dom)
            paper = published.get((spec.key, dom))
            mean = float(t.mean())
            per_model[spec.key] = {
                "programs": len(t),
                "mean_standard_error": float(t.std() / np.sqrt(len(t))),
                "mean": mean,
                "std": float(t.std()),
                "target_mean": target.length_mean,
                "target_std": target.length_std,
                "paper_mean": paper[0] if paper else None,
                "paper_std": paper[1] if paper else None,
                "target_source": "paper" if paper else "interpolated/assumed (services/workload/models.py)",
                "mean_within_15pct": abs(mean / target.length_mean - 1) <= CALIBRATION_TOLERANCE,
            }
        out[dom] = per_model
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    corpus = load_corpus()
    model = OutcomeModel(corpus.problems)
    programs = list(generate(corpus.problems, model, bindings_for(model.models), args.draws, args.seed))
    test_ids = {id(p) for p in programs if is_test_task(p.traces[0].user_text, args.holdout)}
    train = [p for p in programs if id(p) not in test_ids]
    test = [p for p in programs if id(p) in test_ids]
    train_traces = [t for p in train for t in p.traces]
    train_outcomes = [p.outcome for p in train]
    log.info("%d programs (%d test) from a %s corpus", len(programs), len(test), corpus.origin)

    fit_s: dict[str, float] = {}
    routers: dict[str, RouterBackend] = {}
    for name in ["prior", *args.routers]:
        t = time.perf_counter()
        routers[name] = make_router(name)
        routers[name].fit(train_traces, train_outcomes)
        fit_s[f"router/{name}"] = time.perf_counter() - t
        log.info("router %s fitted in %.1f s", name, fit_s[f"router/{name}"])
    t = time.perf_counter()
    predictor = make_predictor("qrf")
    predictor.fit(train_traces)
    fit_s["predictor/qrf"] = time.perf_counter() - t
    log.info("predictor qrf fitted in %.1f s", fit_s["predictor/qrf"])

    observable = QrfPredictor()
    observable.features = ConcatFeatures(
        [*observable.features.parts, _TrueDifficulty({p.text: p.difficulty for p in corpus.problems})]
    )
    observable.fit(train_traces)
    prior = routers.pop("prior")
    problems = {p.id: p for p in corpus.problems}
    result: dict[str, Any] = {
        "command": COMMAND,
        "config": vars(args) | {"out": str(args.out)},
        "corpus": {"origin": corpus.origin, "problems": len(corpus.problems), "sources": corpus.counts()},
        "data": {
            "programs": len(programs),
            "train_programs": len(train),
            "test_programs": len(test),
            "test_trace_rows": sum(len(p.traces) for p in test),
        },
        "fit_seconds": fit_s,
        "router": router_section(routers, prior, _observable_scores(problems, train, test), test),
        "predictor": predictor_section(predictor.predict, observable.predict, test, args.window, args.seed),
        "calibration": calibration_section(corpus.problems, model, args.calibration_draws, args.seed + 1),
    }
    fcfs = _mean([result["predictor"][d]["fcfs_distance"] for d in DOMAINS])
    qrf = _mean([result["predictor"][d]["kendall_tau_distance"] for d in DOMAINS])
    result["predictor_gain_over_fcfs"] = {
        "ours": None if fcfs is None or qrf is None else fcfs - qrf,
        "paper": PAPER_GAIN_OVER_FCFS,
    }
    with tempfile.TemporaryDirectory(prefix="chimera-bench-") as tmp:
        root = Path(tmp)
        for name, r in routers.items():
            artifacts.publish(
                root / f"router-{name}",
                r,
                kind="router",
                backend=name,
                data_hash="bench",
                rows=len(train_outcomes),
                models=r.models,
                metrics={},
            )
        artifacts.publish(
            root / "predictor-qrf",
            predictor,
            kind="predictor",
            backend="qrf",
            data_hash="bench",
            rows=len(train_traces),
            models=predictor.models,
            metrics={},
        )
        test_rows = [t for p in test for t in p.traces]
        result["latency"] = latency_section(root, list(routers), test_rows, args.calls, args.seed)
    result["targets"] = targets(result)
    result["load_average_1m"] = os.getloadavg()[0]  # the machine is shared: context for the latencies
    result["elapsed_s"] = time.perf_counter() - t0
    return result


def main(argv: Sequence[str] | None = None) -> int:
    from bench.learned.predictors_report import write_markdown

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=4000, help="(problem, workflow) draws; each on 6 models")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--holdout", type=float, default=0.25, help="share of tasks held out")
    parser.add_argument("--window", type=int, default=64, help="requests per Kendall comparison set")
    parser.add_argument(
        "--routers", nargs="+", default=["tfidf", "minilm", "modernbert"], help="learned routers to bench"
    )
    parser.add_argument("--calls", type=int, default=300, help="timed calls per latency cell")
    parser.add_argument("--calibration-draws", type=int, default=3000, help="draws per dataset")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="recompute the targets and rewrite predictors.md from the predictors.json in --out (seconds)",
    )
    args = parser.parse_args(argv)
    if args.report_only:
        result = json.loads((args.out / "predictors.json").read_text())
        result["targets"] = targets(result)
        result["report_regenerated_by"] = "python -m bench.learned.predictors --report-only"
        (args.out / "predictors.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        write_markdown(result, args.out / "predictors.md")
        return 0
    if "tfidf" not in args.routers:
        parser.error("--routers must include tfidf (the default backend the targets are about)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "predictors.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    write_markdown(result, args.out / "predictors.md")
    log.info("wrote %s in %.0f s", args.out / "predictors.json", result["elapsed_s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
