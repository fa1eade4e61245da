"""Admission (pure): within the bound, brownout to a close enough model, refusal with a Retry-After; and
the drain meter the Retry-After is measured with."""

from __future__ import annotations

import pytest

from services.common.types import EngineProfile, EngineSnapshot
from services.dispatcher.drain import DrainMeter
from services.policy.admission import MAX_RETRY_S, MIN_RETRY_S, Bounds, admit, retry_after_s, work_s
from services.policy.contract import Selection
from services.policy.routing import Branch, Route

pytestmark = pytest.mark.unit

# 10 ms per token at batch 10: one predicted token is 1 ms of work, so 1000 tokens are one second.
PROFILE = EngineProfile(10.0, 10)
BOUNDS = Bounds(max_queue_s=5.0, brownout_margin=0.1)
Q = {"big": 0.9, "mid": 0.85, "small": 0.5}


def _eng(eid: str, tokens: int, alive: bool = True) -> EngineSnapshot:
    return EngineSnapshot(eid, eid, PROFILE, tokens, alive=alive)


def _route(engine: str, branch: Branch = "new") -> Route:
    selection = Selection(engine, engine, engine, "load_ms", (), 0.5, 0.05)
    return Route(engine, engine, branch, selection if branch != "reuse" else None)


def test_work_is_the_papers_load_in_seconds() -> None:
    assert work_s(_eng("big", 2500)) == pytest.approx(2.5)


@pytest.mark.parametrize(
    ("name", "engines", "route", "expected", "from_"),
    [
        ("within the bound", [_eng("big", 5000), _eng("mid", 0)], _route("big"), "big", None),
        ("an idle engine takes anything", [_eng("big", 0)], _route("big"), "big", None),
        ("full: a close model with room", [_eng("big", 6000), _eng("mid", 100)], _route("big"), "mid", "big"),
        (
            "full: the most confident of those with room",
            [_eng("big", 6000), _eng("mid", 100), _eng("small", 0)],
            _route("big"),
            "mid",
            "big",
        ),
        (
            "later stages always get in",
            [_eng("big", 10**6), _eng("mid", 0)],
            _route("big", "reuse"),
            "big",
            None,
        ),
    ],
)
def test_admit(
    name: str, engines: list[EngineSnapshot], route: Route, expected: str, from_: str | None
) -> None:
    adm = admit(route, engines, Q, BOUNDS, {})
    assert (adm.engine_id, adm.browned_out_from, adm.refused) == (expected, from_, False), name


@pytest.mark.parametrize(
    ("name", "engines", "route"),
    [
        ("no model within the margin", [_eng("big", 6000), _eng("small", 0)], _route("big")),
        ("the close one is full too", [_eng("big", 6000), _eng("mid", 5001)], _route("big")),
        ("the close one is dead", [_eng("big", 6000), _eng("mid", 0, alive=False)], _route("big")),
        ("a pinned model is not moved", [_eng("big", 6000), _eng("mid", 0)], _route("big", "pinned")),
    ],
)
def test_refuse(name: str, engines: list[EngineSnapshot], route: Route) -> None:
    adm = admit(route, engines, Q, BOUNDS, {})
    assert adm.refused and adm.engine_id == "big" and adm.retry_after_s >= MIN_RETRY_S, name


def test_unbounded_never_refuses() -> None:
    assert not admit(_route("big"), [_eng("big", 10**9)], Q, Bounds(0.0, 0.1), {}).refused


def test_retry_after_from_the_measured_drain_rate_else_the_profile() -> None:
    full = _eng("big", 9000)  # 4 s over the bound: 4000 predicted tokens to drain
    assert admit(_route("big"), [full], Q, BOUNDS, {"big": 500.0}).retry_after_s == 8.0
    assert admit(_route("big"), [full], Q, BOUNDS, {}).retry_after_s == 4.0  # at the profile's speed
    assert retry_after_s(full, 1e9, 1.0) == MAX_RETRY_S
    assert retry_after_s(full, 0.01, 1e9) == MIN_RETRY_S


def test_drain_meter_measures_released_tokens_per_second() -> None:
    meter = DrainMeter(window_s=10.0, min_span_s=1.0)

    def snap(drained: int) -> list[EngineSnapshot]:
        return [EngineSnapshot("big", "big", PROFILE, 0, drained_tokens=drained)]

    meter.observe(snap(0), 100.0)
    assert meter.rates() == {}  # not measured long enough yet
    meter.observe(snap(1000), 102.0)
    assert meter.rates() == {"big": pytest.approx(500.0)}
    meter.observe(snap(1500), 120.0)  # the first samples fall out of the window
    assert meter.rates()["big"] == pytest.approx(500 / 18)
    meter.observe(snap(10), 121.0)  # the counter went back (Redis lost it): start over
    assert meter.rates() == {}
