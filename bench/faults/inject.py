"""The faults, one small function each, against a stack this benchmark started (never anything else).

Every fault is blocking (it runs in a thread beside the clients): it marks the moment it struck with
``FaultEnv.fire``, then waits for the stack to bring the process back. A process that the stack does not
bring back within ``restart_grace_s`` is restarted by the benchmark itself, the same way the stack started
it, and the result says who did it: that is a finding, not an error of the benchmark.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import redis

from services.common.keys import Keys
from services.common.redis_client import connect_sync
from services.launcher.stack import Stack
from services.launcher.supervisor import Child

SUPERVISOR_BACKOFF_MAX_S = 30.0  # services.launcher.supervisor's restart backoff cap


@dataclass(frozen=True, slots=True)
class Injection:
    kind: str
    injectable: bool
    target: str = ""
    # Who brought the process back: supervisor | launcher | benchmark | none | n/a (nothing was killed).
    restarted_by: str = "n/a"
    back_after_s: float | None = None  # fault to the process answering again
    note: str = ""


@dataclass
class FaultEnv:
    stack: Stack
    keys: Keys
    restart_grace_s: float = 10.0
    health_timeout_s: float = 90.0
    fired_at: float | None = None
    crash_file: Path | None = None  # the armed engine dies once this file appears (its fault knob)
    # Processes the benchmark started itself (a Redis it restarted): stopped at exit.
    own: list[subprocess.Popen[bytes]] = field(default_factory=list)
    paused: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)

    def fire(self) -> None:
        self.fired_at = time.monotonic()

    def since(self) -> float:
        assert self.fired_at is not None
        return round(time.monotonic() - self.fired_at, 2)

    def redis(self) -> redis.Redis:
        return connect_sync(self.stack.redis_url, socket_timeout=2.0)

    def child(self, name: str) -> Child:
        return next(c for c in self.stack.supervisor.children if c.name == name)

    def resume_all(self) -> None:
        """Continue anything paused (before the stack stops: a stopped Redis would stall its shutdown)."""
        for pid in list(self.paused):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.paused.clear()

    def stop_own(self) -> None:
        """Stop what the benchmark started itself, after the stack (its children still used it)."""
        for p in self.own:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def _wait(env: FaultEnv, cond: Callable[[], bool], timeout_s: float, every_s: float = 0.1) -> bool:
    """Poll ``cond`` until true, ``timeout_s`` passes, or the benchmark is stopping (Ctrl-C, SIGTERM)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not env.stopping.is_set():
        with contextlib.suppress(Exception):
            if cond():
                return True
        time.sleep(every_s)
    return False


def _kill_child(env: FaultEnv, name: str, kind: str) -> Injection:
    """SIGKILL a supervised child; then whoever brings it back, and when it is healthy again."""
    c = env.child(name)
    assert c.proc is not None
    pid, restarts = c.proc.pid, c.restarts
    os.kill(pid, signal.SIGKILL)
    env.fire()
    target = f"{name} pid {pid}"

    def replaced() -> bool:
        return c.proc is not None and c.proc.pid != pid and c.alive()

    # A restartable child is left to the supervisor, whose backoff reaches 30 s: racing it would start two.
    if _wait(env, replaced, SUPERVISOR_BACKOFF_MAX_S + 5.0 if c.restart else env.restart_grace_s):
        by = "supervisor"
    elif c.restart:
        by = "none"
    else:
        # Not restarted (a supervisor that restarts only children marked restartable): the benchmark
        # restarts it with the stack's own command line, environment and log, on the same ports.
        with env.lock:
            if not replaced():
                c.proc.wait()
                c.close_log()
                c.start()
        by = "benchmark"
    healthy = _wait(env, c.probe, env.health_timeout_s, 0.2)
    note = f"{c.restarts - restarts} supervisor restart(s)"
    return Injection(kind, True, target, by, env.since() if healthy else None, note)


def worker_kill(env: FaultEnv) -> Injection:
    """SIGKILL the worker that holds the most claims (its running requests must come back via the lease)."""
    r = env.redis()
    try:
        claims = {e.id: int(r.zcard(env.keys.claims(e.id))) for e in env.stack.pool.engines}
    finally:
        r.close()
    engine = max(claims, key=lambda k: claims[k])
    inj = _kill_child(env, f"worker-{engine}", "worker_kill")
    return replace(inj, note=f"{inj.note}; it held {claims[engine]} claims")


# The simulated engine's fault knob (CHIMERA_WORKER_SIM_FAULT_DIE_FILE): it dies once that file appears,
# and removes it, so the restarted engine lives.
DIE_FILE = "sim_fault_die_file"
CRASH_ENGINE = "large"  # the slow engine: the most requests running at any moment


def engine_crash(env: FaultEnv) -> Injection:
    """The engine dies under a live worker. A simulated engine dies by its own fault knob, armed at stack
    start and pulled here, mid-load like every other fault (``crash_file``); a real engine has a child
    process, which is killed."""
    c = env.child(f"worker-{CRASH_ENGINE}")
    assert c.proc is not None
    worker_pid = c.proc.pid

    def gone() -> bool:
        return c.proc is None or c.proc.pid != worker_pid or not c.alive()

    if env.crash_file is not None:
        env.crash_file.touch()  # the engine polls for it every 50 ms
        env.fire()
        target = f"simulated engine of worker-{CRASH_ENGINE} (fault knob {DIE_FILE})"
    else:
        kids = psutil.Process(worker_pid).children(recursive=True)
        if not kids:
            env.fire()
            return Injection(
                "engine_crash",
                False,
                f"worker-{CRASH_ENGINE}",
                note="not injectable: no fault knob armed and no engine child process to kill",
            )
        kids[0].kill()
        env.fire()
        target = f"engine pid {kids[0].pid} under worker-{CRASH_ENGINE}"
    # The worker should see its engine die and exit, so that the supervisor restarts both.
    exited = _wait(env, gone, 20.0)
    back = _wait(env, lambda: c.proc is not None and c.proc.pid != worker_pid and c.probe(), 45.0, 0.2)
    note = "worker exited on its own" if exited else "worker kept running with a dead engine"
    return Injection(
        "engine_crash",
        True,
        target,
        "supervisor" if back else "none",
        env.since() if back else None,
        note,
    )


def router_kill(env: FaultEnv) -> Injection:
    return _kill_child(env, "router", "router_kill")


def predictor_kill(env: FaultEnv) -> Injection:
    return _kill_child(env, "predictor", "predictor_kill")


def dispatcher_kill(env: FaultEnv) -> Injection:
    return _kill_child(env, "dispatcher", "dispatcher_kill")


def dispatcher_kill_replica(env: FaultEnv, lease_wait_s: float = 30.0) -> Injection:
    """Two dispatchers on one Redis, the clients given both addresses: SIGKILL the one that holds the
    reaper lease. The other serves the workflows meanwhile (the SDK's retries re-attach through it) and
    takes over the reaping once the dead one's lease runs out (3 rounds of the reaper)."""
    kind = "dispatcher_kill_replica"
    fronts = [c for c in env.stack.supervisor.children if c.name.startswith("dispatcher")]
    if len(fronts) < 2:
        env.fire()
        return Injection(kind, False, "dispatcher", note="not injectable: the stack runs one dispatcher")

    def lease_holder() -> str | None:
        r = env.redis()
        try:
            value = r.get(env.keys.reaper_lease())
            return None if value is None else str(value)
        finally:
            r.close()

    def child_of(replica: str | None) -> str | None:
        """The child whose replica name (host:pid) that is."""
        pid = (replica or "").rpartition(":")[2]
        return next((c.name for c in fronts if c.proc is not None and str(c.proc.pid) == pid), None)

    holder = lease_holder()
    target = child_of(holder)  # before the kill: its restart has another pid
    inj = _kill_child(env, target or fronts[0].name, kind)
    if holder is None:
        lease = "no replica held the reaper lease"
    elif target is None:
        lease = f"the reaper lease was held by {holder}, not by a dispatcher of the stack"
    elif _wait(env, lambda: lease_holder() not in (None, holder), lease_wait_s, 0.2):
        now = lease_holder()
        lease = (
            f"it held the reaper lease; {child_of(now) or now} took it over {env.since()} s after the kill"
        )
    else:
        lease = f"it held the reaper lease; nobody took it over within {lease_wait_s:g} s"
    return replace(inj, note=f"{inj.note}; {len(fronts)} dispatchers; {lease}")


def _redis_proc(env: FaultEnv) -> psutil.Process:
    r = env.redis()
    try:
        pid = int(r.info("server")["process_id"])
    finally:
        r.close()
    return psutil.Process(pid)


def redis_kill(env: FaultEnv) -> Injection:
    """SIGKILL redis-server; restart it on the same socket and directory unless the launcher does."""
    if any(c.name == "redis" for c in env.stack.supervisor.children):
        return _kill_child(env, "redis", "redis_kill")  # the launcher supervises its private Redis
    proc = _redis_proc(env)
    argv, cwd, pid = proc.cmdline(), proc.cwd(), proc.pid
    proc.kill()
    env.fire()

    def new_pid() -> int | None:
        r = env.redis()
        try:
            return int(r.info("server")["process_id"])
        finally:
            r.close()

    def back() -> bool:
        p = new_pid()
        return p is not None and p != pid

    by = "launcher"
    if not _wait(env, back, env.restart_grace_s, 0.05):
        # Same command line (so the same socket, directory and persistence settings); the stale socket
        # file is removed first, as start_private_redis does.
        sock = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--unixsocket"), None)
        if sock:
            Path(sock).unlink(missing_ok=True)
        env.own.append(subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        by = "benchmark"
    ok = _wait(env, back, env.health_timeout_s, 0.05)
    return Injection("redis_kill", True, f"redis-server pid {pid}", by, env.since() if ok else None)


def redis_pause(env: FaultEnv, pause_s: float = 3.0) -> Injection:
    """SIGSTOP redis-server for ``pause_s``, then SIGCONT: a stall, not a loss."""
    proc = _redis_proc(env)
    env.paused.add(proc.pid)
    try:
        proc.suspend()
        env.fire()
        env.stopping.wait(pause_s)
    finally:
        proc.resume()
        env.paused.discard(proc.pid)
    return Injection("redis_pause", True, f"redis-server pid {proc.pid}", note=f"SIGSTOP for {pause_s:g} s")


FAULTS: dict[str, Callable[[FaultEnv], Injection]] = {
    "worker_kill": worker_kill,
    "engine_crash": engine_crash,
    "router_kill": router_kill,
    "predictor_kill": predictor_kill,
    "redis_kill": redis_kill,
    "redis_pause": redis_pause,
    "dispatcher_kill": dispatcher_kill,
    "dispatcher_kill_replica": dispatcher_kill_replica,
}

# Dispatchers the stack runs for a kind (1 unless named here); the clients are given every one's address.
DISPATCHERS: dict[str, int] = {"dispatcher_kill_replica": 2}
