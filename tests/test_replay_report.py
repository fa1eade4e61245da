"""The live replay's typed results: the committed replay.json reads back losslessly, and the report's checks.

Nothing here starts a service: the replay itself runs for half an hour, so its results are tested as data.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.sweep.replay_report import (
    LiveSummary,
    PolicyResult,
    ReplayResult,
    SimSummary,
    flipped_pairs,
    mean,
    orders,
    table,
)
from services.launcher.config import LauncherSettings
from services.launcher.stack import running_stack

pytestmark = pytest.mark.unit

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"


def _result(live_ms: float, sim_ms: float, live_score: float = 0.5, sim_score: float = 0.5) -> PolicyResult:
    return PolicyResult(
        live=LiveSummary(
            latency_per_token_ms=live_ms,
            score=live_score,
            dispatch_share_of_e2e=0.02,
            router_share_of_e2e=0.005,
            predictor_share_of_e2e=0.01,
            scheduler_share_of_e2e=0.005,
            dispatch_ms_per_workflow=50.0,
            share_7b=0.3,
        ),
        sim=SimSummary(latency_per_token_ms=sim_ms, score=sim_score, share_7b=0.3),
    )


def test_committed_results_round_trip_through_the_types() -> None:
    raw = json.loads((RESULTS / "replay.json").read_text())
    typed = ReplayResult.from_dict(raw)
    assert typed.to_dict() == raw
    # Key order too: the JSON is rewritten by --report-only and must not churn in diffs.
    assert json.dumps(typed.to_dict(), indent=1) + "\n" == (RESULTS / "replay.json").read_text()
    assert table(typed) + f"\nCommand: `{typed.command}`\n" == (RESULTS / "replay.md").read_text()


def test_flipped_pairs_lists_the_pairs_ordered_differently() -> None:
    policies = {
        "a": _result(live_ms=10.0, sim_ms=11.0),
        "b": _result(live_ms=12.0, sim_ms=10.5),  # live says a < b, the simulator b < a
        "c": _result(live_ms=20.0, sim_ms=20.0),
    }
    assert flipped_pairs(policies, "latency_per_token_ms") == [("a", "b", 0.5)]
    assert flipped_pairs(policies, "score") == []
    assert orders(policies, "latency_per_token_ms") == (("a", "b", "c"), ("b", "a", "c"))


def test_a_tie_on_one_side_only_is_a_flip() -> None:
    policies = {"a": _result(10.0, 10.0, live_score=0.5, sim_score=0.5), "b": _result(11.0, 11.0, 0.6, 0.5)}
    assert flipped_pairs(policies, "score") == [("a", "b", 0.0)]


def test_mean_averages_each_metric_per_policy_and_side() -> None:
    got = mean([{"a": _result(10.0, 12.0)}, {"a": _result(20.0, 16.0)}])
    assert got["a"].live.latency_per_token_ms == 15.0
    assert got["a"].sim.latency_per_token_ms == 14.0
    assert got["a"].live.dispatch_ms_per_workflow == 50.0


def test_dispatcher_env_cannot_rewire_the_stack(tmp_path: Path) -> None:
    # Rejected before anything starts, so this needs no services.
    settings = LauncherSettings.ephemeral(tmp_path)
    for bad in ({"CHIMERA_DISPATCHER_PORT": "1"}, {"CHIMERA_ROUTER_PORT": "1"}):
        with pytest.raises(ValueError, match="dispatcher_env"), running_stack(settings, dispatcher_env=bad):
            pass
