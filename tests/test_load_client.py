"""The load client's record of failures: when they ended (failures at one instant point at one event)."""

from bench.load.client import Outcome, Tally, _failure_times


def test_failure_times_per_status() -> None:
    t = Tally(
        outcomes=[
            Outcome(),  # ok: not a failure
            Outcome("CANCELLED", e2e_s=31.0, ended=110.0),
            Outcome("CANCELLED", e2e_s=1.0, ended=105.0),
            Outcome("UNAVAILABLE", e2e_s=2.0, ended=102.0),
        ]
    )
    got = _failure_times(t, t0=100.0)
    assert set(got) == {"CANCELLED", "UNAVAILABLE"}
    assert got["CANCELLED"]["lasted_s_min"] == 1.0 and got["CANCELLED"]["lasted_s_max"] == 31.0
    assert got["CANCELLED"]["ended_s_min"] == 5.0 and got["CANCELLED"]["ended_s_max"] == 10.0
