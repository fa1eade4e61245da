"""``bench.learned.loops``: the moments a loop's turns make and their held-out order keys, on made-up loops
(not measurements): the arithmetic, and that the evaluation runs end to end."""

from __future__ import annotations

import pytest

from bench.learned.loops import evaluate, moments

pytestmark = pytest.mark.unit


def _loop(problem: str, outputs: list[int], passed_last: bool, engine: str = "e") -> dict[str, object]:
    turns = [
        {
            "completion_tokens": n,
            "prompt_tokens": 100 + 50 * k,
            "passed": passed_last and k == len(outputs) - 1,
            "tool_result_chars": 6 if passed_last and k == len(outputs) - 1 else 300,
        }
        for k, n in enumerate(outputs)
    ]
    return {"problem_id": problem, "engine": engine, "turns": turns}


def test_each_turn_is_a_moment_with_what_remained_after_it() -> None:
    ms = moments([_loop("p1", [40, 50, 60], passed_last=True)])
    assert [(m.turn, m.attained, m.remaining, m.last_output) for m in ms] == [
        (0, 0, 150, 0),
        (1, 40, 110, 40),
        (2, 90, 60, 50),
    ]
    assert [m.last_failed for m in ms] == [False, True, True]


def test_the_evaluation_gives_every_order_key_and_the_p90_coverage() -> None:
    rows = [_loop(f"p{i}", [30 + i] * (1 + i % 4), passed_last=i % 2 == 0) for i in range(20)]
    result = evaluate(moments(rows))
    assert result["loops"] == 20 and result["folds"] == 5
    assert set(result["kendall_tau_distance"]) == {
        "open_loop_predictor",
        "least_attained_service",
        "per_request_sjf",
    }
    assert all(0.0 <= v <= 1.0 for v in result["kendall_tau_distance"].values())
    assert 0.0 <= result["p90_coverage"] <= 1.0
