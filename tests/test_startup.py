"""A starting worker's progress, and the launcher's rule for it: a start that keeps moving is waited for
however long it takes; one whose record stops moving fails within the stall limit, with the step it was
at and its log's last lines.

The children here are real processes (a Python sleeper); what they report comes from a fake progress probe
that stands in for the worker's Redis record, so the rule can be driven in seconds.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from services.common.startup import Phase, StartupState, stalled_for
from services.launcher.supervisor import Child, Supervisor

pytestmark = pytest.mark.timeout(60)

SLEEPER = "import time; print('loading the engine', flush=True); time.sleep(120)"


@pytest.mark.unit
def test_state_round_trips_through_a_redis_hash_and_reads_as_text() -> None:
    s = StartupState(Phase.FETCHING, "qwen: part 2 of 5", 150.0, 494.0, "MB", 1000, 2000, "w1")
    raw = {k.encode(): v.encode() for k, v in s.to_mapping().items()}  # as HGETALL returns it undecoded
    assert StartupState.from_mapping(raw) == s
    assert s.describe() == "fetching qwen: part 2 of 5: 150/494 MB"
    assert StartupState(Phase.LOADING, "vllm engine m").describe() == "loading vllm engine m"
    assert StartupState.from_mapping({}) is None
    assert StartupState.from_mapping({"phase": "loading", "done": "many"}) is None  # unreadable, not a crash


@pytest.mark.unit
def test_stalled_only_past_the_limit() -> None:
    assert stalled_for(100.0, 150.0, 60.0) is None
    assert stalled_for(100.0, 170.0, 60.0) == 70.0


class FakeProgress:
    """Stands in for a worker's start-up record: ``advance()`` is one report (a new count in its phase)."""

    def __init__(self) -> None:
        self.state: StartupState | None = None
        self.count = 0

    def advance(self, phase: str = Phase.PROFILING) -> None:
        self.count += 1
        self.state = StartupState(
            phase, "batch 1", self.count, 100, "points", updated_ms=int(time.time() * 1000)
        )

    def __call__(self) -> StartupState | None:
        return self.state


def _child(tmp_path: Path, probe_ready: list[bool], progress: FakeProgress) -> Child:
    c = Child("worker-e0", [sys.executable, "-c", SLEEPER], {}, tmp_path / "w.log", lambda: probe_ready[0])
    c.progress = progress
    return c


def test_a_start_that_keeps_moving_is_not_given_up_past_the_stall_limit(tmp_path: Path) -> None:
    ready = [False]
    progress = FakeProgress()
    child = _child(tmp_path, ready, progress)
    sup = Supervisor()
    sup.add(child)

    # Reports every 0.3 s for 3 s (ten times the 0.8 s stall limit and past the 1 s group timeout), then
    # healthy: the launcher must wait it out.
    def starting() -> None:
        for _ in range(10):
            progress.advance()
            time.sleep(0.3)
        ready[0] = True

    t = threading.Thread(target=starting)
    t.start()
    try:
        began = time.monotonic()
        sup.start_and_wait([child], timeout_s=1.0, stall_s=0.8)
        assert time.monotonic() - began >= 2.5
        assert progress.count == 10
    finally:
        t.join()
        sup.stop_all()


def test_a_start_that_stops_moving_fails_with_its_phase_and_log(tmp_path: Path) -> None:
    progress = FakeProgress()
    progress.advance(Phase.CONVERTING)  # one report, then nothing: a conversion that hangs
    child = _child(tmp_path, [False], progress)
    sup = Supervisor()
    sup.add(child)
    try:
        began = time.monotonic()
        with pytest.raises(RuntimeError) as err:
            sup.start_and_wait([child], timeout_s=30.0, stall_s=1.0)
        assert time.monotonic() - began < 10, "a hang is found in the stall limit, not the group timeout"
        text = str(err.value)
        assert "worker-e0 made no progress" in text and "converting batch 1: 1/100 points" in text
        assert "loading the engine" in text  # the child's log tail
    finally:
        sup.stop_all()


def test_a_record_left_by_an_earlier_start_is_not_progress(tmp_path: Path) -> None:
    progress = FakeProgress()
    progress.state = StartupState(
        Phase.PROFILING, "old", 5, 10, "points", updated_ms=int(time.time() * 1000) - 60_000
    )
    child = _child(tmp_path, [False], progress)
    sup = Supervisor()
    sup.add(child)
    try:
        with pytest.raises(RuntimeError, match="no start-up report yet"):
            sup.start_and_wait([child], timeout_s=30.0, stall_s=1.0)
    finally:
        sup.stop_all()


def test_a_child_that_dies_while_starting_fails_at_once(tmp_path: Path) -> None:
    progress = FakeProgress()
    progress.advance()
    child = Child(
        "worker-e0",
        [sys.executable, "-c", "print('no model'); raise SystemExit(2)"],
        {},
        tmp_path / "w.log",
        lambda: False,
    )
    child.progress = progress
    sup = Supervisor()
    sup.add(child)
    try:
        with pytest.raises(RuntimeError, match="exited during start-up"):
            sup.start_and_wait([child], timeout_s=30.0, stall_s=30.0)
    finally:
        sup.stop_all()
