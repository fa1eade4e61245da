"""A private ``redis-server`` for ``chimera up`` and the tests, when no Redis URL is configured.

It listens on a Unix socket only (``--port 0``), so it can never collide with a Redis a user already runs,
and keeps nothing on disk: Chimera's queue state is soft state that a restart rebuilds from clients' retries.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis


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
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed: run `make venv` (installs it) or set a Redis URL")
    workdir.mkdir(parents=True, exist_ok=True)
    sock = workdir / "redis.sock"
    sock.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--unixsocketperm",
            "700",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
            "--maxclients",
            "4000",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with code {proc.returncode}")
        try:
            if sock.exists() and redis.Redis(unix_socket_path=str(sock)).ping():
                return PrivateRedis(proc, sock)
        except redis.ConnectionError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("redis-server did not start in time")
