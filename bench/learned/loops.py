"""How well the remaining work of an open agent loop can be ordered, on the real loops of
``bench/data/agent/loops.jsonl`` (``make collect-agent``: the coding agent on the real Qwen2.5-Coder
engines).

Each turn of each loop is a moment a scheduler orders: the loop's next stage waits, and what actually
remains is the output tokens of that turn and every later one (the loop's length is unknown to everyone).
Three order keys are compared on those moments, by Kendall-tau distance (the share of pairs put in the wrong
order; ``services.predictor.training.kendall_tau_distance``):

- **per-request SJF**: the length of this turn alone, predicted as the last turn's output (a loop resubmits
  code of about the same size), and for a first turn the mean first turn of its model in the training folds;
- **least attained service** (llm-d's order for programs): the output tokens the loop produced so far;
- **the open-loop predictor**: quantile regression forests (``quantile-forest``, as the product's predictor)
  of what remains, from what a scheduler knows when the turn waits: the turn index, the output and prompt
  tokens so far, whether the last tool result was a failure and how long it was, the model. Its p90 is
  checked for coverage (the share of moments whose remaining work is at most the p90).

Folds are held out by problem (5, grouped), so no problem's loop is both learnt from and judged.
``python -m bench.learned.loops`` writes ``bench/results/agent_loops.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from quantile_forest import RandomForestQuantileRegressor
from sklearn.model_selection import GroupKFold

from bench.common.markdown import table
from bench.common.paths import DATA, RESULTS, dataset_commit
from services.predictor.training import kendall_tau_distance

LOOPS = DATA / "agent" / "loops.jsonl"
FOLDS = 5


@dataclass(frozen=True, slots=True)
class Moment:
    """One waiting turn of one loop, as a scheduler sees it, and what remained after it."""

    problem_id: str
    engine: str
    turn: int
    attained: int  # output tokens of the loop's earlier turns
    prompt_tokens: int  # of this turn
    last_failed: bool
    last_report_chars: int
    last_output: int  # the previous turn's output tokens (0 for a first turn)
    output: int  # this turn's output tokens (hindsight: what per-request SJF would like to know)
    remaining: int  # output tokens of this turn and every later one


def moments(rows: Sequence[dict[str, Any]]) -> list[Moment]:
    out = []
    for r in rows:
        turns = r["turns"]
        outputs = [int(t["completion_tokens"]) for t in turns]
        for k, t in enumerate(turns):
            prev = turns[k - 1] if k else None
            out.append(
                Moment(
                    problem_id=r["problem_id"],
                    engine=r["engine"],
                    turn=k,
                    attained=sum(outputs[:k]),
                    prompt_tokens=int(t["prompt_tokens"]),
                    last_failed=bool(prev and not prev["passed"]),
                    last_report_chars=int(prev["tool_result_chars"]) if prev else 0,
                    last_output=outputs[k - 1] if k else 0,
                    output=outputs[k],
                    remaining=sum(outputs[k:]),
                )
            )
    return out


def _features(ms: Sequence[Moment], engines: Sequence[str]) -> np.ndarray:
    return np.array(
        [
            [m.turn, m.attained, m.prompt_tokens, m.last_failed, m.last_report_chars, m.last_output]
            + [m.engine == e for e in engines]
            for m in ms
        ],
        dtype=np.float64,
    )


def evaluate(ms: Sequence[Moment], seed: int = 0) -> dict[str, Any]:
    """Held-out order keys for every moment, then each key's Kendall-tau distance and the p90's coverage."""
    engines = sorted({m.engine for m in ms})
    x, y = _features(ms, engines), np.array([m.remaining for m in ms], dtype=np.float64)
    groups = [m.problem_id for m in ms]
    p50, p90, sjf = np.zeros(len(ms)), np.zeros(len(ms)), np.zeros(len(ms))
    n_folds = min(FOLDS, len(set(groups)))
    for train, test in GroupKFold(n_splits=n_folds).split(x, y, groups):
        qrf = RandomForestQuantileRegressor(n_estimators=200, min_samples_leaf=3, random_state=seed)
        qrf.fit(x[train], y[train])
        q = qrf.predict(x[test], quantiles=[0.5, 0.9])
        p50[test], p90[test] = q[:, 0], q[:, 1]
        # Per-request SJF's guess for a first turn: its model's mean first turn in the training folds.
        first = {
            e: statistics.fmean([ms[i].output for i in train if ms[i].turn == 0 and ms[i].engine == e] or [0])
            for e in engines
        }
        for i in test:
            sjf[i] = ms[i].last_output if ms[i].turn else first[ms[i].engine]
    las = np.array([m.attained for m in ms], dtype=np.float64)
    return {
        "moments": len(ms),
        "loops": sum(m.turn == 0 for m in ms),
        "problems": len(set(groups)),
        "folds": n_folds,
        "kendall_tau_distance": {
            "open_loop_predictor": kendall_tau_distance(y, p50, seed),
            "least_attained_service": kendall_tau_distance(y, las, seed),
            "per_request_sjf": kendall_tau_distance(y, sjf, seed),
        },
        "p90_coverage": float(np.mean(y <= p90)),
        "remaining_tokens": {"mean": float(y.mean()), "median": float(np.median(y)), "max": float(y.max())},
    }


def report(result: dict[str, Any]) -> str:
    k = result["kendall_tau_distance"]
    rows = [
        (name.replace("_", " "), "-" if v is None else f"{v:.3f}")
        for name, v in (
            ("open_loop_predictor", k["open_loop_predictor"]),
            ("least_attained_service", k["least_attained_service"]),
            ("per_request_sjf", k["per_request_sjf"]),
        )
    ]
    lines = [
        "# Ordering open agent loops by their remaining work",
        "",
        f"Produced by `{result['command']}` at commit `{result['commit']}`, from"
        f" `bench/data/agent/loops.jsonl` (data commit `{result['data_commit']}`):"
        f" {result['loops']} real coding-agent loops on {result['problems']} problems,"
        f" {result['moments']} waiting turns, folds held out by problem ({result['folds']})."
        " Lower Kendall-tau distance is a better order; 0.5 is a random one.",
        "",
        *table(["order key", "Kendall-tau distance"], rows),
        "",
        f"The open-loop predictor's p90 covers {result['p90_coverage']:.1%} of what remained"
        " (target 85-95%).",
        f"Remaining output tokens per waiting turn: mean {result['remaining_tokens']['mean']:.0f}, median"
        f" {result['remaining_tokens']['median']:.0f}, max {result['remaining_tokens']['max']:.0f}.",
        "",
        f"{result['passed_after_a_failure']} of {result['loops']} loops passed after a failed test run: with"
        " greedy decoding a failing loop tends to resubmit the same code, so what remains is mostly the turns"
        " left times the last turn's length. Loops that recover (sampling, a stronger tool report) are harder"
        " to order, and this data does not say how much harder.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loops", type=Path, default=LOOPS)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    rows = [json.loads(x) for x in args.loops.read_text().splitlines() if x.strip()]
    result = evaluate(moments(rows))
    result |= {
        "passed_after_a_failure": sum(bool(r["passed"]) and len(r["turns"]) > 1 for r in rows),
        "command": "python -m bench.learned.loops",
        "commit": dataset_commit(Path(__file__).parents[2]) or "",
        "data_commit": dataset_commit(args.loops.parent) or "",
    }
    (args.out / "agent_loops.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "agent_loops.md").write_text(report(result))
    print(report(result))


if __name__ == "__main__":
    main()
