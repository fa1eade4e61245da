"""Child-process supervision for ``chimera up``: start, wait for health, restart whatever crashed, stop.

NOTE(supervisor): this mirrors compose.yaml's ``depends_on: service_healthy`` and ``restart: unless-stopped``
policies for a machine without Docker. Every child, Redis included, is restarted after it exits, each on its
own backoff, so no dead child (however often it dies) keeps the others from being restarted. Services are
stopped in reverse start order with SIGTERM, so that the dispatcher stops taking work before the workers and
Redis go away.
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
from services.common.startup import StartupState, stalled_for

log = logging.getLogger(__name__)

HealthProbe = Callable[[], bool]
# What a starting child says it is doing (a worker's start-up record), or None before its first report.
ProgressProbe = Callable[[], StartupState | None]

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
# A child that stayed up this long had recovered: its next crash is restarted at the base delay again.
STABLE_S = 60.0


def backoff(streak: int) -> float:
    """Delay before a child's restart, given how many times in a row it died soon after a restart."""
    return min(BACKOFF_CAP_S, BACKOFF_BASE_S * float(2 ** min(streak, 16)))  # no overflow for a long streak


@dataclass
class Child:
    name: str
    argv: list[str]
    env: Mapping[str, str]
    log_path: Path
    probe: HealthProbe
    restart: bool = True  # False: a one-shot, left as it exits (compose's restart: "no")
    # A child that reports its start-up progress is waited for while it progresses (start_and_wait), not
    # for a fixed time.
    progress: ProgressProbe | None = None
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0  # every restart since the launch
    streak: int = 0  # restarts since the child last stayed up STABLE_S: the backoff's exponent
    started_at: float = 0.0
    started_unix: float = 0.0  # the same moment by the wall clock, which start-up reports are stamped in
    next_restart: float = 0.0  # when a dead child is due to restart; 0 while none is scheduled
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
        self.started_at = time.monotonic()
        self.started_unix = time.time()
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
    def __init__(self, python: str = sys.executable, stable_s: float = STABLE_S) -> None:
        self.python = python
        self.stable_s = stable_s
        self.children: list[Child] = []

    def add(self, child: Child) -> Child:
        self.children.append(child)
        return child

    def start_and_wait(self, group: list[Child], timeout_s: float, stall_s: float | None = None) -> None:
        """Start a group together, then wait until every member is healthy (or fail with its log tail).

        A member without a progress probe must be healthy within ``timeout_s``. One with a progress probe
        (a worker) is waited for as long as its start-up record keeps moving, and fails once it has not
        moved for ``stall_s`` (default ``timeout_s``): a first start that downloads, converts and profiles
        for many minutes is not a hang, and a hang is found in ``stall_s`` whatever came before it.
        """
        for c in group:
            c.start()
        watches = {c.name: StartWatch(c, timeout_s if stall_s is None else stall_s) for c in group}
        deadline = time.monotonic() + timeout_s
        pending = list(group)
        while pending:
            for c in list(pending):
                if not c.alive():
                    raise RuntimeError(f"{c.name} exited during start-up:\n{tail(c.log_path)}")
                if c.probe():
                    log.info("%s is healthy after %.0f s", c.name, time.monotonic() - c.started_at)
                    pending.remove(c)
                    continue
                if c.progress is not None:
                    watches[c.name].check()
                elif time.monotonic() > deadline:
                    raise RuntimeError(f"{c.name} not healthy after {timeout_s:.0f}s\n{tail(c.log_path)}")
            if pending:
                time.sleep(0.2)

    def check(self) -> None:
        """Restart every child that has exited, each once its backoff has passed. Never raises for one
        child: a restart that fails (say, out of file descriptors) is logged and tried again later."""
        now = time.monotonic()
        for c in self.children:
            if c.proc is None or c.alive() or not c.restart:
                continue
            try:
                self._revive(c, now)
            except OSError:
                log.exception("could not restart %s; trying again", c.name)
                c.next_restart = 0.0

    def _revive(self, c: Child, now: float) -> None:
        assert c.proc is not None
        if c.next_restart == 0.0:
            if now - c.started_at >= self.stable_s:
                c.streak = 0
            delay = backoff(c.streak)
            c.next_restart = now + delay
            log.warning(
                "%s exited (code %s); restarting in %.1fs. Its log ends:\n%s",
                c.name,
                c.proc.returncode,
                delay,
                tail(c.log_path, 10),
            )
        elif now >= c.next_restart:
            c.sweep()
            c.close_log()
            c.next_restart = 0.0
            c.start()
            c.restarts += 1
            c.streak += 1
            log.warning("restarted %s (restart %d since launch)", c.name, c.restarts)

    def stop_all(self, grace_s: float = 15.0) -> None:
        for c in reversed(self.children):
            c.signal(signal.SIGTERM)
            if not c.wait(grace_s):
                log.warning("%s did not stop in %.0fs; killing", c.name, grace_s)
                c.signal(signal.SIGKILL)
                c.wait(5)
            c.sweep()
            c.close_log()


class StartWatch:
    """One starting child's progress: says what it is doing when that changes (and every ``say_every_s``
    while it does not), and fails the start once its record has not moved for ``stall_s``."""

    def __init__(self, child: Child, stall_s: float, say_every_s: float = 15.0) -> None:
        self.child = child
        self.stall_s = stall_s
        self.say_every_s = say_every_s
        self._last: StartupState | None = None
        self._moved = time.monotonic()  # the child's own start counts as its first progress
        self._said = 0.0

    def check(self) -> None:
        c = self.child
        assert c.progress is not None
        now = time.monotonic()
        state = c.progress()
        # A record left by an earlier start (or another process) says nothing about this one.
        if state is not None and not state.written_since(c.started_unix):
            state = None
        if state is not None and state != self._last:
            self._last, self._moved = state, now
            self._say(state, now)
        elif state is not None and now - self._said >= self.say_every_s:
            self._say(state, now)
        idle = stalled_for(self._moved, now, self.stall_s)
        if idle is not None:
            doing = self._last.describe() if self._last is not None else "no start-up report yet"
            raise RuntimeError(
                f"{c.name} made no progress for {idle:.0f} s (limit {self.stall_s:.0f} s), last: {doing}\n"
                f"{tail(c.log_path)}"
            )

    def _say(self, state: StartupState, now: float) -> None:
        self._said = now
        since = now - self._moved
        still = f", {since:.0f} s in this step" if since >= 1 else ""
        log.info(
            "%s: %s (%.0f s since start%s)",
            self.child.name,
            state.describe(),
            now - self.child.started_at,
            still,
        )


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
