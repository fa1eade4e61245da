"""The launcher's supervisor cleans up after a child killed outright: what the child started (a worker's
vLLM engine processes) does not outlive it. It restarts every child that dies, each on its own backoff, and
one that keeps dying stops no other from being restarted."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from services.launcher.supervisor import BACKOFF_BASE_S, BACKOFF_CAP_S, Child, Supervisor, backoff

pytestmark = pytest.mark.timeout(60)

# A child that starts a grandchild (as a worker starts vLLM's EngineCore) and prints its pid.
SCRIPT = """
import subprocess, sys, time
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(g.pid, flush=True)
time.sleep(120)
"""


def test_a_killed_childs_processes_are_swept(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    child = Child("c", [sys.executable, "-c", SCRIPT], {}, log, probe=lambda: True)
    child.start()
    deadline = time.monotonic() + 30
    while not log.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = psutil.Process(int(log.read_text().split()[0]))
    assert child.proc is not None
    os.kill(child.proc.pid, signal.SIGKILL)  # the child alone, as a crash or a fault test would
    assert child.wait(10)
    assert grandchild.is_running() and grandchild.status() != psutil.STATUS_ZOMBIE  # orphaned, alive
    child.sweep()
    grandchild.wait(10)  # raises TimeoutExpired if it survived
    child.close_log()


SLEEPER = "import time; time.sleep(120)"


def _wait_for(cond: Callable[[], bool], sup: Supervisor, timeout_s: float = 20.0) -> None:
    """Drive the supervisor as the launcher's watcher does until ``cond`` holds."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "the supervisor did not get there in time"
        sup.check()
        time.sleep(0.05)


def test_every_child_is_restarted_and_a_dead_one_stops_no_other(tmp_path: Path) -> None:
    sup = Supervisor()
    # A service that is not a worker (the router, say), and one that dies as soon as it starts, every time.
    router = sup.add(Child("router", [sys.executable, "-c", SLEEPER], {}, tmp_path / "r.log", lambda: True))
    broken = sup.add(
        Child("broken", [sys.executable, "-c", "raise SystemExit(3)"], {}, tmp_path / "b.log", lambda: True)
    )
    oneshot = sup.add(
        Child("oneshot", [sys.executable, "-c", "pass"], {}, tmp_path / "o.log", lambda: True, restart=False)
    )
    try:
        router.start()
        broken.start()
        oneshot.start()
        assert broken.wait(10) and oneshot.wait(10)
        _wait_for(lambda: broken.restarts >= 2, sup)  # restarted, died again: check() never raised
        assert router.proc is not None
        first_pid = router.proc.pid
        os.kill(first_pid, signal.SIGKILL)
        _wait_for(lambda: router.alive() and router.restarts == 1, sup)
        assert router.proc.pid != first_pid
        assert broken.streak >= 2 and backoff(broken.streak) > backoff(0), "a crash loop backs off"
        assert oneshot.restarts == 0 and not oneshot.alive(), "a one-shot is left as it exited"
    finally:
        sup.stop_all(grace_s=5)


def test_a_child_that_stayed_up_restarts_without_its_old_backoff(tmp_path: Path) -> None:
    sup = Supervisor(stable_s=0.5)
    child = sup.add(Child("c", [sys.executable, "-c", SLEEPER], {}, tmp_path / "c.log", lambda: True))
    try:
        child.start()
        child.streak = 6  # as if it had crashed six times in a row: a 30 s backoff
        time.sleep(0.6)  # ... but then it stayed up past stable_s
        assert child.proc is not None
        os.kill(child.proc.pid, signal.SIGKILL)
        assert child.wait(10)
        sup.check()
        assert child.next_restart - time.monotonic() <= backoff(0)
        _wait_for(lambda: child.alive(), sup, timeout_s=5)
        assert child.restarts == 1
    finally:
        sup.stop_all(grace_s=5)


@pytest.mark.parametrize("streak", [0, 3, 10, 10_000])
def test_backoff_doubles_up_to_its_cap(streak: int) -> None:
    assert backoff(streak) == min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** min(streak, 16))
