"""``bench.learned.loops``: the held-out order keys of loop moments (``services.predictor.loops``), on
made-up loops (not measurements): that the evaluation runs end to end and gives every key."""

from __future__ import annotations

import pytest

from bench.learned.loops import evaluate
from services.predictor.loops import loop_moments

pytestmark = pytest.mark.unit


def _loop(problem: str, outputs: list[int], passed_last: bool, model: str = "m") -> dict[str, object]:
    turns = [
        {
            "model": model,
            "completion_tokens": n,
            "prompt_tokens": 100 + 50 * k,
            "passed": passed_last and k == len(outputs) - 1,
            "tool_result_chars": 6 if passed_last and k == len(outputs) - 1 else 300,
        }
        for k, n in enumerate(outputs)
    ]
    return {"problem_id": problem, "turns": turns}


def test_the_evaluation_gives_every_order_key_and_the_p90_coverage() -> None:
    rows = [_loop(f"p{i}", [30 + i] * (1 + i % 4), passed_last=i % 2 == 0) for i in range(20)]
    result = evaluate(loop_moments(rows))
    assert result["loops"] == 20 and result["folds"] == 5
    assert set(result["kendall_tau_distance"]) == {
        "open_loop_predictor",
        "least_attained_service",
        "per_request_sjf",
        "with_the_engine_prompt_count",
    }
    assert all(v is None or 0.0 <= v <= 1.0 for v in result["kendall_tau_distance"].values())
    assert 0.0 <= result["p90_coverage"] <= 1.0
