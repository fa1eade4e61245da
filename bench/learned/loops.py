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
- **the open-loop predictor**: the forest the predictor serves for open loops (``services.predictor.loops``,
  with its defaults) of what remains, from what a scheduler knows when the turn waits: the turn index, the
  output tokens so far, whether the last tool result was a failure and how long it was, the previous turn's
  output, the model. Its p90 is checked for coverage (the share of moments whose remaining work is at most
  the p90). Beside it, the same forest given the engine's prompt count as well, which serving does not have
  before the stage runs: what that count would be worth.

Folds are held out by problem (5, grouped), so no problem's loop is both learnt from and judged.
``python -m bench.learned.loops`` writes ``bench/results/agent_loops.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from quantile_forest import RandomForestQuantileRegressor
from sklearn.model_selection import GroupKFold

from bench.common.markdown import table
from bench.common.paths import DATA, RESULTS, dataset_commit
from services.predictor.loops import FEATURES, LoopForest, LoopMoment, loop_moments, read_loops
from services.predictor.training import kendall_tau_distance

LOOPS = DATA / "agent" / "loops.jsonl"
FOLDS = 5


def _with_prompt(ms: Sequence[LoopMoment], models: Sequence[str]) -> np.ndarray:
    """The served forest's features plus the engine's prompt count, which serving does not have: how much
    that count would buy (``services.predictor.loops`` says why it is left out)."""
    return np.array(
        [
            [m.state.turn, m.state.attained_tokens, m.prompt_tokens, m.state.last_tool_failed]
            + [m.state.last_tool_chars, m.state.last_output_tokens]
            + [m.model == e for e in models]
            for m in ms
        ],
        dtype=np.float64,
    )


def evaluate(ms: Sequence[LoopMoment], seed: int = 0) -> dict[str, Any]:
    """Held-out order keys for every moment, then each key's Kendall-tau distance and the p90's coverage."""
    models = sorted({m.model for m in ms})
    y = np.array([m.remaining for m in ms], dtype=np.float64)
    groups = [m.problem_id for m in ms]
    p50, p90, sjf, p50_prompt = (np.zeros(len(ms)) for _ in range(4))
    x_prompt = _with_prompt(ms, models)
    n_folds = min(FOLDS, len(set(groups)))
    for train, test in GroupKFold(n_splits=n_folds).split(x_prompt, y, groups):
        # The forest the predictor serves, with its defaults, fitted on the training folds.
        served = LoopForest(seed=seed).fit([ms[i] for i in train])
        q = served.predict([ms[i].state for i in test], [ms[i].model for i in test], (0.5, 0.9))
        p50[test], p90[test] = q[:, 0], q[:, 1]
        ref = RandomForestQuantileRegressor(n_estimators=200, min_samples_leaf=3, random_state=seed)
        ref.fit(x_prompt[train], y[train])
        p50_prompt[test] = ref.predict(x_prompt[test], quantiles=[0.5])
        # Per-request SJF's guess for a first turn: its model's mean first turn in the training folds.
        first = {
            e: statistics.fmean(
                [ms[i].output for i in train if ms[i].state.turn == 0 and ms[i].model == e] or [0]
            )
            for e in models
        }
        for i in test:
            sjf[i] = ms[i].state.last_output_tokens if ms[i].state.turn else first[ms[i].model]
    las = np.array([m.state.attained_tokens for m in ms], dtype=np.float64)
    return {
        "moments": len(ms),
        "loops": sum(m.state.turn == 0 for m in ms),
        "problems": len(set(groups)),
        "folds": n_folds,
        "features": list(FEATURES) + ["model"],
        "kendall_tau_distance": {
            "open_loop_predictor": kendall_tau_distance(y, p50, seed),
            "least_attained_service": kendall_tau_distance(y, las, seed),
            "per_request_sjf": kendall_tau_distance(y, sjf, seed),
            "with_the_engine_prompt_count": kendall_tau_distance(y, p50_prompt, seed),
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
            ("the forest with the engine's prompt count (not served)", k["with_the_engine_prompt_count"]),
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
    rows = read_loops(args.loops)
    result = evaluate(loop_moments(rows))
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
