"""A service started as ``python -m <module>``, its log kept for the lines a test waits for."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

from test_router_process import stop_service


class Service:
    """``python -m <module>`` with its stderr drained by a thread (a full pipe would stall the process) and
    kept for the log lines the test reads."""

    def __init__(self, module: str, env: dict[str, str]) -> None:
        self.module = module
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module], env={**os.environ, **env}, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def wait_for(self, pattern: re.Pattern[str], timeout_s: float = 60) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if m := pattern.search(line):
                    return m
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{self.module}: no {pattern.pattern!r} in:\n{''.join(self.lines)}")

    def stop(self) -> int:
        return stop_service(self.proc)


def dispatcher_env(redis_url: str, key_prefix: str, **settings: str) -> dict[str, str]:
    """A dispatcher's environment on this Redis and prefix, every port picked by the OS; ``settings`` adds
    ``CHIMERA_DISPATCHER_<NAME>`` values (``grace_s="1"``)."""
    env = {"CHIMERA_REDIS_URL": redis_url, "CHIMERA_KEY_PREFIX": key_prefix}
    for name in ("port", "http_port", "metrics_port"):
        env[f"CHIMERA_DISPATCHER_{name.upper()}"] = "0"
    env.update({f"CHIMERA_DISPATCHER_{k.upper()}": v for k, v in settings.items()})
    return env
