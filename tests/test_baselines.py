"""Baseline policies (vLLM, MLFQ, LTR, vLLM-STJF) and chimera-plus: table-driven, pure, no services."""

from __future__ import annotations

import pytest

from services.common.types import EngineProfile, EngineSnapshot
from services.policy.aging import fcfs_priority, priority_score
from services.policy.chimera import select_engine
from services.policy.chimera_plus import plus_margin, plus_select
from services.policy.contract import NoLiveEngine
from services.policy.estimates import completion_ms, occupancy
from services.policy.mlfq import MLFQ_LEVEL_FLOORS, mlfq_level, mlfq_priority
from services.policy.registry import POLICIES
from services.policy.vllm import vllm_score, vllm_select

pytestmark = pytest.mark.unit

FAST = EngineProfile(8.0, 256, 0.04, ((1, 8.0), (256, 16.0)))
SLOW = EngineProfile(30.0, 64, 0.2, ((1, 30.0), (64, 45.0)))


def _eng(
    eid: str,
    profile: EngineProfile,
    queued: int = 0,
    running: int = 0,
    tokens: int = 0,
    alive: bool = True,
) -> EngineSnapshot:
    return EngineSnapshot(eid, eid, profile, tokens, queued=queued, running=running, alive=alive)


@pytest.mark.parametrize(
    ("name", "engines", "expected"),
    [
        ("lowest 4w+r wins", [_eng("a", FAST, 1, 0), _eng("b", SLOW, 0, 3)], "b"),  # 4 vs 3
        ("waiting weighs four running", [_eng("a", FAST, 1, 0), _eng("b", SLOW, 0, 5)], "a"),  # 4 vs 5
        ("tie: less in-flight work", [_eng("a", FAST, 0, 2, 900), _eng("b", SLOW, 0, 2, 100)], "b"),
        ("tie and equal work: faster engine", [_eng("b", SLOW), _eng("a", FAST)], "a"),
        ("dead engines are ignored", [_eng("a", FAST, alive=False), _eng("b", SLOW, 5, 5)], "b"),
    ],
)
def test_vllm_select_by_load_alone(name: str, engines: list[EngineSnapshot], expected: str) -> None:
    # The confidences say "b" is far better and tau is huge: vLLM must not care.
    sel = vllm_select(engines, {"a": 0.0, "b": 1.0}, 1e9, 0.0)
    assert sel.engine_id == expected, name
    assert sel.fast_engine == expected
    # The balancer has no slack or margin test: the record says so instead of faking one, and its cost is
    # the balancer's own score, not a time.
    assert sel.cost_name == "vllm_score"
    assert all(c.slack_ok is None and c.margin_ok is None for c in sel.checks)
    assert sel.cost[expected] == min(sel.cost.values())


def test_vllm_score_and_no_engine() -> None:
    assert vllm_score(_eng("a", FAST, queued=3, running=2)) == 14
    with pytest.raises(NoLiveEngine):
        vllm_select([_eng("a", FAST, alive=False)], {}, 0.0, 0.0)


@pytest.mark.parametrize(
    ("t_a", "y_a", "t_b", "y_b", "a_first"),
    [
        (1.0, 9000, 2.0, 1, True),  # earlier arrival first whatever the prediction
        (2.0, 1, 1.0, 9000, False),
        (5.0, 10, 5.0, 10, None),  # equal: the queue's arrival tie-break decides
    ],
)
def test_fcfs_priority_ignores_prediction(
    t_a: float, y_a: int, t_b: float, y_b: int, a_first: bool | None
) -> None:
    a, b = fcfs_priority(y_a, t_a, 20.0, 8192), fcfs_priority(y_b, t_b, 20.0, 8192)
    if a_first is None:
        assert a == b
    else:
        assert (a < b) == a_first


@pytest.mark.parametrize(
    ("attained", "level"),
    [(0, 0), (-5, 0), (255, 0), (256, 1), (1023, 1), (1024, 2), (4095, 2), (4096, 3), (10**6, 3)],
)
def test_mlfq_levels(attained: int, level: int) -> None:
    assert mlfq_level(attained) == level


def test_mlfq_priority_fcfs_within_level_and_demotion_across() -> None:
    rate, cap = 20.0, 8192
    # Same level: arrival order.
    assert mlfq_priority(10, 100.0, rate, cap) < mlfq_priority(200, 100.5, rate, cap)
    # A demoted job (level 1) sorts behind a fresh one that arrived a little later ...
    assert mlfq_priority(0, 110.0, rate, cap) < mlfq_priority(300, 100.0, rate, cap)
    # ... until it has waited (floor_1 - floor_0) / rate seconds longer: then it is promoted by aging.
    promote_after = (MLFQ_LEVEL_FLOORS[1] - MLFQ_LEVEL_FLOORS[0]) / rate
    assert mlfq_priority(300, 100.0, rate, cap) < mlfq_priority(0, 100.0 + promote_after + 0.1, rate, cap)


def test_ltr_and_stjf_sort_on_what_they_are_fed() -> None:
    # Both use Chimera's aged score; LTR is fed per-stage estimates, vLLM-STJF the true workflow remainder.
    for name in ("ltr", "vllm-stjf"):
        pol = POLICIES[name]
        assert pol.priority is priority_score and pol.select is vllm_select
        assert pol.priority(50, 10.0, 20.0, 8192) < pol.priority(500, 10.0, 20.0, 8192)


def test_registry_lists_every_policy_and_keeps_chimera() -> None:
    assert set(POLICIES) >= {"chimera", "chimera-plus", "vllm", "vllm-stjf", "ltr", "mlfq"}
    assert POLICIES["chimera"].select is select_engine
    assert POLICIES["chimera-plus"].select is plus_select
    assert POLICIES["mlfq"].priority is mlfq_priority
    assert POLICIES["vllm"].priority is fcfs_priority


def test_completion_counts_batch_speed_prefill_and_queue() -> None:
    idle = completion_ms(_eng("a", FAST), nominal_tokens=100, prefill_per_token=0.0)
    assert idle == pytest.approx(100 * 8.0)
    busy = completion_ms(_eng("a", FAST, running=255), nominal_tokens=100, prefill_per_token=0.0)
    assert busy == pytest.approx(100 * 16.0)  # joins a batch of 256: the step time at 256
    with_prefill = completion_ms(_eng("a", FAST), nominal_tokens=100, prefill_per_token=2.0)
    assert with_prefill == pytest.approx(100 * (8.0 + 2.0 * 0.04))
    # Running work holds its slots: a huge in-flight ŷ with nothing queued adds nothing ...
    assert completion_ms(_eng("b", SLOW, running=10, tokens=10**6), 100, 0.0) == pytest.approx(
        completion_ms(_eng("b", SLOW, running=10, tokens=0), 100, 0.0)
    )
    # ... while queued work does, in proportion to its share.
    assert completion_ms(_eng("b", SLOW, queued=10, running=64, tokens=10**5), 100, 0.0) > completion_ms(
        _eng("b", SLOW, queued=0, running=64, tokens=10**5), 100, 0.0
    )


@pytest.mark.parametrize(
    ("name", "engines", "q", "tau", "expected"),
    [
        # Idle pool: the paper rule sees L = 0 everywhere; plus compares completion times (30 vs 8 ms).
        ("idle, tau too small for a 3.8x slower model", [_eng("f", FAST), _eng("s", SLOW)], 0.9, 2.0, "f"),
        (
            "idle, tau admits it and the gain beats the scaled margin",
            [_eng("f", FAST), _eng("s", SLOW)],
            0.9,
            3.0,
            "s",
        ),
        # An idle strong engine is priced at the flat delta_s: a gain of 0.15 buys it.
        ("idle, gain above the flat margin", [_eng("f", FAST), _eng("s", SLOW)], 0.25, 3.0, "s"),
        # Three quarters full, the same gain is below delta_s * (1 + (ratio - 1) * 0.75), about 0.2.
        (
            "busy, gain below the occupancy-priced margin",
            [_eng("f", FAST), _eng("s", SLOW, 0, 48)],
            0.25,
            8.0,
            "f",
        ),
        ("busy, gain above it", [_eng("f", FAST), _eng("s", SLOW, 0, 48)], 0.4, 8.0, "s"),
        (
            "fast engine crowded: the slow one is now cheap",
            [_eng("f", FAST, 50, 256), _eng("s", SLOW)],
            0.3,
            0.0,
            "s",
        ),
    ],
)
def test_plus_select(name: str, engines: list[EngineSnapshot], q: float, tau: float, expected: str) -> None:
    sel = plus_select(engines, {"f": 0.1, "s": q}, tau, 0.05)
    assert sel.engine_id == expected, name


def test_plus_margin_rises_with_occupancy_from_flat_to_cost_scaled() -> None:
    idle, half, full = _eng("s", SLOW), _eng("s", SLOW, 0, 32), _eng("s", SLOW, 40, 64)
    assert occupancy(idle) == 0.0 and occupancy(half) == 0.5 and occupancy(full) == 1.0
    assert plus_margin(idle, 4.0, 0.05) == pytest.approx(0.05)
    assert plus_margin(half, 4.0, 0.05) == pytest.approx(0.125)
    assert plus_margin(full, 4.0, 0.05) == pytest.approx(0.2)
    assert plus_margin(full, 0.5, 0.05) == pytest.approx(0.05)  # never below the paper's flat margin


def test_paper_rule_idle_corner_that_plus_fixes() -> None:
    pool = [_eng("f", FAST, tokens=0), _eng("s", SLOW, running=1, tokens=10)]
    # One sequence on the slow engine and none on the fast: L_fast = 0, so no tau lets the paper rule move.
    assert select_engine(pool, {"f": 0.1, "s": 0.9}, 1e6, 0.05).engine_id == "f"
    assert plus_select(pool, {"f": 0.1, "s": 0.9}, 4.0, 0.05).engine_id == "s"


def test_plus_select_validates() -> None:
    with pytest.raises(ValueError):
        plus_select([_eng("f", FAST)], {}, -1.0, 0.0)
    with pytest.raises(NoLiveEngine):
        plus_select([_eng("f", FAST, alive=False)], {}, 0.0, 0.0)
