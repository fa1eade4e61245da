"""Each vLLM engine on its own core: CPU affinity for a worker's whole process tree, every thread.

The launcher gives each in-process vLLM engine its own OpenMP binding (``services.launcher.cores``), which
binds the engine's compute threads only. The collector pins the whole process tree from outside as well:
``sched_setaffinity`` on every thread of the worker process and of its children (the engine-core process
vLLM spawns), as ``taskset -a -p`` would, so tokenizer and scheduler threads stay on the engine's core too.
Threads started later inherit it from their creator.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

log = logging.getLogger(__name__)


def core_plan(engines: Sequence[str], cores: Sequence[int]) -> dict[str, set[int]]:
    """One core per engine while there are enough; with fewer cores, engines share them in turn."""
    if not cores:
        raise ValueError("no cores to pin to")
    return {e: {cores[i % len(cores)]} for i, e in enumerate(engines)}


def _tids(pid: int) -> list[int]:
    try:
        return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except FileNotFoundError:
        return []  # ended meanwhile


def process_tree(pid: int) -> list[int]:
    """``pid`` and every descendant (Linux ``/proc/<pid>/task/<tid>/children``)."""
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        for tid in _tids(p):
            try:
                todo += [int(c) for c in Path(f"/proc/{p}/task/{tid}/children").read_text().split()]
            except FileNotFoundError:
                continue
    return tree


def pin_tree(pid: int, cores: set[int]) -> int:
    """Pin every thread of ``pid`` and of its descendants to ``cores``; returns how many threads."""
    pinned = 0
    for proc in process_tree(pid):
        for tid in _tids(proc):
            try:
                os.sched_setaffinity(tid, cores)
                pinned += 1
            except ProcessLookupError:
                continue  # a thread that ended meanwhile
    return pinned


def pin_engines(worker_pids: Mapping[str, int], plan: Mapping[str, set[int]]) -> dict[str, int]:
    """Pin each engine's worker tree to its planned cores; threads pinned per engine."""
    done = {}
    for engine, pid in worker_pids.items():
        done[engine] = pin_tree(pid, plan[engine])
        log.info(
            "engine %s (worker pid %d): %d threads pinned to cores %s",
            engine,
            pid,
            done[engine],
            plan[engine],
        )
    return done
