"""CPU time per process group of a measured run: the benchmark client, a server it started, each Chimera
service of a launcher stack and its Redis."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

import psutil  # type: ignore[import-untyped]


def process_groups(server_pid: int, stack: Any) -> dict[str, tuple[int, bool]]:
    """Name -> (pid, count its descendants too) of every process that serves a request, for CPU time."""
    return {"vllm_server": (server_pid, True), "bench_client": (os.getpid(), False), **stack_groups(stack)}


def stack_groups(stack: Any) -> dict[str, tuple[int, bool]]:
    """``process_groups`` of a launcher stack alone: each child with its descendants, and its Redis."""
    groups = {c.name: (c.proc.pid, True) for c in stack.supervisor.children if c.proc is not None}
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.name().startswith("redis-server"):
                groups["redis"] = (p.pid, False)
    return groups


def cpu_seconds(groups: Mapping[str, tuple[int, bool]]) -> dict[str, float]:
    """User + system CPU seconds used so far by each group (0 for a process that is gone)."""
    out: dict[str, float] = {}
    for name, (pid, tree) in groups.items():
        total = 0.0
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            for p in [root, *(root.children(recursive=True) if tree else [])]:
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    total += t.user + t.system
        out[name] = total
    return out
