"""The soak: one stack, mixed workflows kept in flight for minutes, a random fault every 30-60 s.

The same counters as the one-fault runs, over every workflow started in the soak, plus each fault's time
until new work is served again. New workflows stop at the end of the soak; those in flight get their budget
to finish, then the accounting must drain to zero like after any run.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.faults.count import count
from bench.faults.drive import plan, time_to_serve, workflow_client
from bench.faults.inject import DISPATCHERS, FAULTS, FaultEnv, Injection
from bench.faults.stack import RunConfig, doors, drain, log_errors, traced, watched_load
from services.launcher.stack import Stack
from services.workload.corpus import Problem


@dataclass(frozen=True, slots=True)
class SoakConfig:
    minutes: float = 20.0
    concurrency: int = 16  # workflows kept in flight
    every_s: tuple[float, float] = (30.0, 60.0)  # a fault every uniform(lo, hi) seconds
    # Every kind: the soak's stack arms the crash knob of one engine (one shot per pull, so the restarted
    # engine can be crashed again) and runs as many dispatchers as the most demanding kind needs.
    kinds: tuple[str, ...] = tuple(FAULTS)

    @property
    def dispatchers(self) -> int:
        return max((DISPATCHERS.get(k, 1) for k in self.kinds), default=1)

    @property
    def arms_crash(self) -> bool:
        return "engine_crash" in self.kinds


async def _fault(env: FaultEnv, stack: Stack, kind: str, cfg: RunConfig, t0: float) -> dict[str, Any]:
    env.fired_at = None
    fault = asyncio.create_task(asyncio.to_thread(FAULTS[kind], env))
    recovery = asyncio.create_task(
        time_to_serve(doors(stack), cfg.drive, lambda: env.fired_at, cfg.recovery_limit_s)
    )
    try:
        injection = await fault
    except Exception as exc:  # recorded, and the soak goes on
        injection = Injection(kind, False, note=f"injection failed: {type(exc).__name__}: {exc}")
    if not injection.injectable:
        recovery.cancel()
    try:
        recovery_s = await recovery
    except asyncio.CancelledError:
        recovery_s = None
    return {
        "at_s": round((env.fired_at or time.monotonic()) - t0, 1),
        "injection": asdict(injection),
        "recovery_s": recovery_s,
    }


async def run_soak(
    stack: Stack, env: FaultEnv, problems: Sequence[Problem], cfg: RunConfig, soak: SoakConfig
) -> dict[str, Any]:
    rng = random.Random(cfg.seed)
    load = watched_load(stack, env, cfg.drive)
    t0 = time.monotonic()
    end = t0 + soak.minutes * 60
    faults: list[dict[str, Any]] = []

    async def chaos() -> None:
        while True:
            wait = rng.uniform(*soak.every_s)
            if time.monotonic() + wait >= end:
                return
            await asyncio.sleep(wait)
            faults.append(await _fault(env, stack, rng.choice(soak.kinds), cfg, t0))

    async with workflow_client(doors(stack), cfg.drive) as client:
        chaos_task = asyncio.create_task(chaos())
        running: set[asyncio.Task[None]] = set()
        started = 0
        while time.monotonic() < end:
            while len(running) < soak.concurrency:
                (p,) = plan(problems, 1, rng, prefix="soak", start=started)
                started += 1
                task = asyncio.create_task(load.one(client, p, time.monotonic() + cfg.workflow_budget_s))
                running.add(task)
                task.add_done_callback(running.discard)
            await asyncio.sleep(0.1)
        await chaos_task
        await asyncio.gather(*running)
    left, drained_s = await drain(stack, env.keys, cfg.drain_s)
    counts = count(load.records, await asyncio.to_thread(traced, stack, env.keys))
    return {
        "minutes": soak.minutes,
        "concurrency": soak.concurrency,
        "every_s": list(soak.every_s),
        "kinds": list(soak.kinds),
        "dispatchers": len(stack.dispatcher_addrs),
        "faults": faults,
        "counts": counts.as_dict(),
        "residue": left,
        "drained_after_s": drained_s,
        "restarts": {c.name: c.restarts for c in stack.supervisor.children if c.restarts},
        "log_errors": log_errors(stack),
        "run_s": round(time.monotonic() - t0, 1),
    }
