"""The launcher's supervisor cleans up after a child killed outright: what the child started (a worker's
vLLM engine processes) does not outlive it."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from services.launcher.supervisor import Child

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
