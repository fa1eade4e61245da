"""What the tests that run real ``python -m services.worker`` processes (simulated engine, a measuring
instrument) or drive the queue scripts by hand share: a stage request, a worker's environment, a process
spawner that kills what it started, and polling a condition."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from services.common.keys import Keys
from services.common.redis_proc import PrivateRedis
from services.common.types import ChatMessage, SamplingParams, StageRequest

ROOT = Path(__file__).resolve().parents[1]


def stage_request(rid: str, max_tokens: int = 16, program_id: str | None = None) -> StageRequest:
    """A first stage of its own program (``p-<rid>`` unless given)."""
    return StageRequest(
        request_id=rid,
        program_id=program_id or f"p-{rid}",
        stage=0,
        workflow="code/coder",
        messages=(ChatMessage("user", f"Write a function named {rid}."),),
        sampling=SamplingParams(max_tokens=max_tokens),
    )


def worker_env(redis: PrivateRedis, keys: Keys, engine: str, **knobs: str) -> dict[str, str]:
    """A simulated-engine worker of ``engine`` on model ``sim-m``; ``knobs`` are CHIMERA_WORKER_* overrides
    (by their env names) on top of a small, fast default."""
    env = dict(os.environ)
    env.update(
        CHIMERA_REDIS_URL=redis.url,
        CHIMERA_KEY_PREFIX=keys.prefix,
        CHIMERA_WORKER_ENGINE_ID=engine,
        CHIMERA_WORKER_MODEL="sim-m",
        CHIMERA_WORKER_ENGINE_KIND="simulated",
        CHIMERA_WORKER_MAX_NUM_SEQS="2",
        CHIMERA_WORKER_PREFETCH="1",
        CHIMERA_WORKER_CLAIM_WAIT_S="0.2",
        CHIMERA_WORKER_SIM_LENGTH_SIGMA="0",
        CHIMERA_WORKER_TIME_SCALE="4",
        **knobs,
    )
    return env


class Spawner:
    """Starts worker processes (logs in ``log_dir``) and kills whichever are still running at ``close``."""

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._procs: list[subprocess.Popen[bytes]] = []

    def __call__(self, env: dict[str, str], name: str) -> subprocess.Popen[bytes]:
        log = (self._log_dir / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.worker"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        self._procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


async def wait_until(cond: Callable[[], Awaitable[Any]], timeout: float, every_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(every_s)
