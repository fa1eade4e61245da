"""Algorithm 1 (select_engine) and the priority score: the paper's boundary cases, table-driven."""

from __future__ import annotations

import math

import pytest

from services.common.types import EngineProfile, EngineSnapshot
from services.policy.aging import priority_score, wait_bound_s
from services.policy.chimera import select_engine
from services.policy.contract import NoLiveEngine
from services.policy.estimates import engine_load_ms
from services.policy.registry import POLICIES

pytestmark = pytest.mark.unit


def _eng(
    eid: str, model: str, tokens: int, ms: float = 10.0, batch: int = 8, alive: bool = True
) -> EngineSnapshot:
    return EngineSnapshot(eid, model, EngineProfile(ms, batch), inflight_tokens=tokens, alive=alive)


# A small fast model, a mid one and a big slow one; the big one is the most confident.
POOL = (
    _eng("small", "m-1.5b", 800, ms=5.0, batch=16),  # L = 250
    _eng("mid", "m-7b", 400, ms=10.0, batch=8),  # L = 500
    _eng("big", "m-14b", 300, ms=20.0, batch=8),  # L = 750
)
Q = {"m-1.5b": 0.30, "m-7b": 0.55, "m-14b": 0.80}


def test_engine_load_is_the_papers_ttlt_proxy() -> None:
    assert engine_load_ms(_eng("e", "m", 1000, ms=12.0, batch=4)) == pytest.approx(3000.0)
    assert engine_load_ms(_eng("e", "m", 0)) == 0.0


@pytest.mark.parametrize(
    ("name", "tau", "delta_s", "expected"),
    [
        ("tau->0 picks the fastest", 0.0, 0.05, "small"),
        ("tau->inf picks the most confident", math.inf, 0.05, "big"),
        ("huge finite tau picks the most confident", 1e9, 0.05, "big"),
        ("delta_s->inf never switches", math.inf, math.inf, "small"),
        ("slack admits mid only", 1.0, 0.05, "mid"),  # bound 500: big (750) fails, mid passes
        ("slack admits big", 2.0, 0.05, "big"),  # bound 750, inclusive
        ("margin too large for mid, big out of slack", 1.0, 0.3, "small"),
        ("margin exactly met counts", 1.0, 0.25, "mid"),  # 0.55 >= 0.30 + 0.25
    ],
)
def test_selection_boundaries(name: str, tau: float, delta_s: float, expected: str) -> None:
    sel = select_engine(POOL, Q, tau, delta_s)
    assert sel.engine_id == expected, name
    assert sel.fast_engine == "small"
    assert sel.switched == (expected != "small")


def test_scan_is_by_descending_confidence_and_records_every_candidate() -> None:
    sel = select_engine(POOL, Q, 1.0, 0.05)
    assert [c.engine_id for c in sel.checks] == ["big", "mid", "small"]
    by_id = {c.engine_id: c for c in sel.checks}
    assert (by_id["big"].slack_ok, by_id["big"].margin_ok) == (False, True)
    assert (by_id["mid"].slack_ok, by_id["mid"].margin_ok) == (True, True)
    assert (by_id["small"].slack_ok, by_id["small"].margin_ok) == (True, False)
    assert sel.cost_name == "load_ms"
    assert sel.cost == {"small": 250.0, "mid": 500.0, "big": 750.0}
    assert sel.q == {"small": 0.30, "mid": 0.55, "big": 0.80}
    rec = select_engine(POOL, Q, math.inf, math.inf).to_record()
    assert rec["tau"] == "inf" and rec["engine"] == "small" and len(rec["candidates"]) == 3


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        ((300, 100, 200), "b"),
        ((0, 0, 0), "a"),  # all tied: equal profile, then engine id
        ((5, 5, 1), "c"),
    ],
)
@pytest.mark.parametrize("delta_s", [0.0, 0.05, math.inf])
@pytest.mark.parametrize("tau", [0.0, 0.5, math.inf])
def test_homogeneous_pool_collapses_to_least_loaded(
    loads: tuple[int, int, int], expected: str, delta_s: float, tau: float
) -> None:
    pool = [_eng(eid, "same", y) for eid, y in zip("abc", loads, strict=True)]
    assert select_engine(pool, {"same": 0.7}, tau, delta_s).engine_id == expected


def test_idle_fast_engine_blocks_any_loaded_switch_even_with_infinite_slack() -> None:
    # The paper's rule as written: L_fast = 0 makes the slack bound 0 (documented corner).
    pool = [_eng("small", "s", 0, ms=5.0), _eng("big", "b", 10, ms=20.0)]
    assert select_engine(pool, {"s": 0.1, "b": 0.9}, math.inf, 0.05).engine_id == "small"
    # ...while another idle engine may still win on confidence.
    pool = [_eng("small", "s", 0, ms=5.0), _eng("big", "b", 0, ms=20.0)]
    sel = select_engine(pool, {"s": 0.1, "b": 0.9}, 0.0, 0.05)
    assert (sel.engine_id, sel.fast_engine) == ("big", "small")


def test_idle_tie_goes_to_the_faster_engine() -> None:
    pool = [_eng("a-slow", "x", 0, ms=30.0), _eng("b-fast", "y", 0, ms=3.0)]
    assert select_engine(pool, {}, 0.5, 0.05).fast_engine == "b-fast"


@pytest.mark.parametrize("tau", [0.0, 1.0, math.inf])
def test_dead_engines_are_never_chosen(tau: float) -> None:
    pool = [
        _eng("dead-idle", "m-14b", 0, ms=1.0, alive=False),
        _eng("live", "m-1.5b", 500),
        _eng("dead-confident", "m-70b", 0, alive=False),
    ]
    sel = select_engine(pool, {"m-14b": 0.99, "m-70b": 1.0, "m-1.5b": 0.1}, tau, 0.0)
    assert sel.engine_id == "live"
    assert [c.engine_id for c in sel.checks] == ["live"]


def test_no_live_engine_raises() -> None:
    with pytest.raises(NoLiveEngine):
        select_engine([_eng("d", "m", 0, alive=False)], {"m": 1.0}, 0.5, 0.05)
    with pytest.raises(NoLiveEngine):
        select_engine([], {}, 0.5, 0.05)


def test_unscored_model_counts_as_zero_confidence() -> None:
    pool = [_eng("known", "k", 100), _eng("unknown", "u", 100)]
    assert select_engine(pool, {"k": 0.2}, 1.0, 0.05).engine_id == "known"


def test_engines_of_one_model_share_its_confidence() -> None:
    pool = [_eng("fast", "small", 400), _eng("big-1", "big", 800), _eng("big-2", "big", 500)]
    sel = select_engine(pool, {"small": 0.2, "big": 0.9}, 0.5, 0.05)
    assert sel.engine_id == "big-2"  # 500 <= 1.5 * 400 = 600; big-1 (800) is out of the slack
    assert sel.q["big-1"] == sel.q["big-2"] == 0.9


@pytest.mark.parametrize(("tau", "delta_s"), [(-0.1, 0.05), (0.5, -1.0)])
def test_negative_knobs_are_rejected(tau: float, delta_s: float) -> None:
    with pytest.raises(ValueError):
        select_engine(POOL, Q, tau, delta_s)


@pytest.mark.parametrize(
    ("y", "t", "rate", "cap", "expected"),
    [
        (100, 0.0, 20.0, 8192, 100.0),
        (100, 10.0, 20.0, 8192, 300.0),
        (10_000, 0.0, 20.0, 8192, 8192.0),  # capped
        (-5, 1.0, 2.0, 8192, 2.0),  # negative predictions clamp to 0
    ],
)
def test_priority_score(y: int, t: float, rate: float, cap: int, expected: float) -> None:
    assert priority_score(y, t, rate, cap) == pytest.approx(expected)


def test_aging_lets_an_old_long_request_overtake_a_new_short_one() -> None:
    old_long = priority_score(1000, 1_700_000_000.0, 20.0, 8192)
    new_short = priority_score(10, 1_700_000_000.0 + 60.0, 20.0, 8192)  # 60 s later: 1200 tokens of credit
    assert old_long < new_short
    assert wait_bound_s(1000, 20.0, 8192) == pytest.approx(50.0)


@pytest.mark.parametrize("rate", [0.0, -1.0])
def test_aging_rate_must_be_positive(rate: float) -> None:
    with pytest.raises(ValueError):
        priority_score(1, 0.0, rate, 10)


def test_registry_has_chimera() -> None:
    pol = POLICIES["chimera"]
    assert pol.select is select_engine and pol.priority is priority_score
    with pytest.raises(TypeError):
        POLICIES["other"] = pol  # type: ignore[index]
