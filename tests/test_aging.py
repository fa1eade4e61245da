"""Property: with the static aging score, no request is served after a later arrival past its bound.

A queue ordered by ``priority_score`` is simulated on a plain sorted list (the same order a Redis sorted
set keeps): random arrivals with random predictions, interleaved with pops. At every pop the request served
must not have arrived later than ``t_r + min(y_r, cap) / aging_rate`` for any request r still waiting.
"""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.policy.aging import priority_score, wait_bound_s

pytestmark = pytest.mark.unit

T0 = 1_700_000_000.0  # real unix times, so float rounding at that magnitude is part of what is tested
# Score rounding at ~3e10 is ~4e-6 tokens; a millisecond is far above it and far below any real bound.
TOL_S = 1e-3

# An event is either an arrival (gap since the previous event in seconds, predicted tokens) or a pop.
_arrival = st.tuples(
    st.just("arrive"),
    st.floats(min_value=0.0, max_value=30.0, allow_nan=False),
    st.integers(min_value=-10, max_value=20_000),
)
_pop = st.tuples(st.just("pop"), st.floats(min_value=0.0, max_value=30.0, allow_nan=False), st.just(0))


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(st.one_of(_arrival, _pop), min_size=1, max_size=120),
    rate=st.floats(min_value=0.01, max_value=1000.0, allow_nan=False),
    cap=st.integers(min_value=1, max_value=10_000),
)
def test_no_request_is_overtaken_by_arrivals_after_its_bound(
    events: list[tuple[str, float, int]], rate: float, cap: int
) -> None:
    now = T0
    queue: list[tuple[float, int]] = []  # (score, seq), the sorted-set order
    arrived: dict[int, tuple[float, int]] = {}  # seq -> (t_enq, y)
    served = 0
    for seq, (kind, gap, y) in enumerate(events):
        now += gap
        if kind == "arrive":
            arrived[seq] = (now, y)
            bisect.insort(queue, (priority_score(y, now, rate, cap), seq))
            continue
        if not queue:
            continue
        _, popped = queue.pop(0)
        served += 1
        t_popped = arrived[popped][0]
        for _, waiting in queue:
            t_w, y_w = arrived[waiting]
            assert t_popped <= t_w + wait_bound_s(y_w, rate, cap) + TOL_S, (
                f"request {popped} (arrived {t_popped - T0:.3f}) overtook {waiting} "
                f"(arrived {t_w - T0:.3f}, y={y_w}) past its bound"
            )
    assert served <= len(arrived)


@settings(max_examples=100, deadline=None)
@given(
    ys=st.lists(st.integers(min_value=0, max_value=5000), min_size=2, max_size=60),
    rate=st.floats(min_value=0.1, max_value=100.0, allow_nan=False),
)
def test_without_elapsed_time_order_is_shortest_first_then_arrival(ys: list[int], rate: float) -> None:
    # Arrivals at the same instant: aging adds nothing, so the order is plain STJF (ties by arrival).
    scored = sorted((priority_score(y, T0, rate, 10_000), i) for i, y in enumerate(ys))
    assert [i for _, i in scored] == sorted(range(len(ys)), key=lambda i: (ys[i], i))
