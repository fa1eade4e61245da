"""Child-process supervision for ``chimera up``: start, wait for health, restart crashed workers, stop.

NOTE(supervisor): this mirrors compose.yaml's ``depends_on: service_healthy`` and ``restart`` policies for a
machine without Docker. Services are stopped in reverse start order with SIGTERM, so that the dispatcher
stops taking work before the workers and Redis go away.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from services.common.health import grpc_unhealthy

log = logging.getLogger(__name__)

HealthProbe = Callable[[], bool]


@dataclass
class Child:
    name: str
    argv: list[str]
    env: Mapping[str, str]
    log_path: Path
    probe: HealthProbe
    restart: bool = False  # restart on crash (workers: a dead engine comes back, its claims re-queued)
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_restart: float = 0.0
    _log_file: object = field(default=None, repr=False)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child's lifetime, closed in stop()
        self._log_file = fh
        self.proc = subprocess.Popen(
            self.argv,
            env={**os.environ, **self.env},
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.info("started %s (pid %d), log %s", self.name, self.proc.pid, self.log_path)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)

    def sweep(self) -> None:
        """Kill what is left of the child's process group once the child itself is gone: a worker killed
        outright leaves its engine's processes (vLLM's EngineCore, 1.8 GB each) orphaned otherwise. Its
        session started with it, so the group id is its pid, and the id is not reused while any member
        lives."""
        if self.proc is not None and self.proc.poll() is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def wait(self, timeout_s: float) -> bool:
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False

    def close_log(self) -> None:
        fh = self._log_file
        if fh is not None:
            fh.close()  # type: ignore[attr-defined]
            self._log_file = None


def grpc_probe(addr: str) -> HealthProbe:
    return lambda: grpc_unhealthy(addr, timeout_s=1.0) is None


class Supervisor:
    def __init__(self, python: str = sys.executable) -> None:
        self.python = python
        self.children: list[Child] = []

    def add(self, child: Child) -> Child:
        self.children.append(child)
        return child

    def start_and_wait(self, group: list[Child], timeout_s: float) -> None:
        """Start a group together, then wait until every member is healthy (or fail with its log tail)."""
        for c in group:
            c.start()
        deadline = time.monotonic() + timeout_s
        pending = list(group)
        while pending:
            for c in list(pending):
                if not c.alive():
                    raise RuntimeError(f"{c.name} exited during start-up:\n{tail(c.log_path)}")
                if c.probe():
                    log.info("%s is healthy", c.name)
                    pending.remove(c)
            if pending and time.monotonic() > deadline:
                names = ", ".join(c.name for c in pending)
                raise RuntimeError(
                    f"not healthy after {timeout_s:.0f}s: {names}\n{tail(pending[0].log_path)}"
                )
            if pending:
                time.sleep(0.2)

    def check(self) -> None:
        """Restart crashed restartable children with exponential backoff; fail on any other crash."""
        now = time.monotonic()
        for c in self.children:
            if c.alive() or c.proc is None:
                continue
            if not c.restart:
                raise RuntimeError(f"{c.name} exited with code {c.proc.returncode}:\n{tail(c.log_path)}")
            if c.next_restart == 0.0:
                c.next_restart = now + min(30.0, 0.5 * 2**c.restarts)
                log.warning("%s exited (code %s); restarting", c.name, c.proc.returncode)
            elif now >= c.next_restart:
                c.sweep()
                c.close_log()
                c.restarts += 1
                c.next_restart = 0.0
                c.start()

    def stop_all(self, grace_s: float = 15.0) -> None:
        for c in reversed(self.children):
            c.signal(signal.SIGTERM)
            if not c.wait(grace_s):
                log.warning("%s did not stop in %.0fs; killing", c.name, grace_s)
                c.signal(signal.SIGKILL)
                c.wait(5)
            c.sweep()
            c.close_log()


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
