"""A private ``redis-server`` for ``chimera up`` and the tests, when no Redis URL is configured.

It listens on a Unix socket only (``--port 0``), so it can never collide with a Redis a user already runs.
It keeps its data in an append-only file under the folder it is given (``appendfsync everysec``): programs,
queues, claims, profiles, traces and outcomes live only in Redis, so a redis-server restarted on the same
folder (the launcher's supervisor does that after a crash) comes back with them. Every write reaches the
OS before Redis answers it, so killing redis-server loses next to nothing; a machine crash loses up to
about a second of writes, the price of not fsyncing each one.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis

# How Redis keeps its data, here and in compose.yaml (tests/test_compose.py holds them equal): an append-only
# file fsynced once a second, and no RDB snapshots besides it (each would fork and dump everything again).
PERSISTENCE = ("--appendonly", "yes", "--appendfsync", "everysec", "--save", "")


@dataclass(frozen=True, slots=True)
class PrivateRedisSpec:
    """How to run the private redis-server of one state folder: the same spec restarts it on its data."""

    workdir: Path

    @property
    def socket(self) -> Path:
        return self.workdir / "redis.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def argv(self) -> list[str]:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed: run `make venv` (installs it) or set a Redis URL"
            )
        return [
            binary,
            "--port",
            "0",
            "--unixsocket",
            str(self.socket),
            "--unixsocketperm",
            "700",
            *PERSISTENCE,
            "--dir",
            str(self.workdir),
            "--maxclients",
            "4000",
        ]

    def prepare(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        # A killed server leaves its socket file behind; the probe must not mistake it for a live one.
        self.socket.unlink(missing_ok=True)

    def responds(self) -> bool:
        """True once the server answers PING (not while it is still loading its AOF)."""
        if not self.socket.exists():
            return False
        client = redis.Redis(unix_socket_path=str(self.socket), socket_timeout=2.0)
        try:
            return bool(client.ping())
        except (redis.ConnectionError, redis.TimeoutError):  # BusyLoadingError is a ConnectionError
            return False
        finally:
            client.close()


@dataclass
class PrivateRedis:
    proc: subprocess.Popen[bytes]
    socket: Path

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_private_redis(workdir: Path, timeout_s: float = 10.0) -> PrivateRedis:
    """Start redis-server on ``workdir``, recovering whatever its AOF there holds; wait until it answers."""
    spec = PrivateRedisSpec(workdir)
    argv = spec.argv()
    spec.prepare()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with code {proc.returncode}")
        if spec.responds():
            return PrivateRedis(proc, spec.socket)
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise RuntimeError("redis-server did not start in time")
