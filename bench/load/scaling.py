"""Inputs of the scaling model (docs/scaling.md), measured on this machine: ``python -m bench.load.scaling``
(``make bench-scaling``, about two minutes) writes ``bench/results/scaling.json``.

A stack of SIMULATED engines (a measuring instrument: they stand in for GPUs, run 1000x faster than their
profile with 256 sequences each, so they never queue) serves four-stage workflows from the SDK in this
process. Measured over that run:

- Redis commands per stage, by command (``INFO commandstats``, reset before the run on the stack's own
  private Redis), and the microseconds Redis spent executing them;
- each process's CPU-seconds per 1,000 stages (``psutil``; this client process is not counted);
- Redis memory kept per finished stage (``MEMORY USAGE`` of request hashes and output streams, sampled);
- a Redis shard's raw throughput here: ``redis-benchmark`` GET/SET and EVALSHA of a one-key script,
  32 clients, no pipelining.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from bench.common.paths import RESULTS
from bench.common.procs import cpu_seconds, stack_groups
from bench.load.run import FAST, sim_pool
from services.common.redis_client import connect_sync
from services.launcher.config import LauncherSettings
from services.launcher.stack import Stack, running_stack
from services.sdk.client import AsyncClient, Completion
from services.sdk.retry import NO_RETRY
from services.sdk.types import Sampling


@dataclass(frozen=True, slots=True)
class ScalingConfig:
    workflows: int = 240
    stages: int = 4
    in_flight: int = 32
    max_tokens: int = 16
    benchmark_requests: int = 100_000


async def _drive(addr: str, cfg: ScalingConfig) -> list[Completion]:
    done: list[Completion] = []
    gate = asyncio.Semaphore(cfg.in_flight)
    async with AsyncClient(addr, retry=NO_RETRY) as client:

        async def workflow(i: int) -> None:
            async with gate:
                for stage in range(cfg.stages):
                    done.append(
                        await client.generate(
                            f"scaling task {i} step {stage}",
                            program_id=f"scale-{i}",
                            stage=stage,
                            workflow="code/planner-coder",
                            sampling=Sampling(max_tokens=cfg.max_tokens),
                        )
                    )
                await client.end_program(f"scale-{i}")

        await asyncio.gather(*(workflow(i) for i in range(cfg.workflows)))
    return done


def _commandstats(r: redis.Redis) -> dict[str, dict[str, float]]:
    stats: dict[str, Any] = r.info("commandstats")
    return {k.removeprefix("cmdstat_"): {"calls": v["calls"], "usec": v["usec"]} for k, v in stats.items()}


def _memory_per_stage(r: redis.Redis, stack: Stack, done: list[Completion]) -> float:
    sample = done[:: max(1, len(done) // 50)]
    total = 0
    for c in sample:
        for key in (
            f"{stack.key_prefix}:{{{c.engine}}}:req:{c.request_id}",
            f"{stack.key_prefix}:{{{c.engine}}}:out:{c.request_id}",
        ):
            total += int(r.memory_usage(key) or 0)
    return total / max(1, len(sample))


def _shard_ops(socket: str, n: int) -> dict[str, float]:
    """Requests per second a single redis-server answers here, by test."""
    script = "return redis.call('HINCRBY', KEYS[1], 'n', 1)"
    out: dict[str, float] = {}
    for name, args in {
        "get": ["-t", "get"],
        "set": ["-t", "set"],
        "evalsha_1key": ["eval", script, "1", "bench:{k}:__rand_int__"],
    }.items():
        proc = subprocess.run(
            ["redis-benchmark", "-s", socket, "-q", "-c", "32", "-n", str(n), "-r", "10000", *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        m = re.findall(r"([\d.]+) requests per second", proc.stdout)
        out[name] = float(m[-1]) if m else 0.0
    return out


def run(cfg: ScalingConfig) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="chimera-scaling-") as tmp:
        settings = LauncherSettings.ephemeral(Path(tmp))
        with running_stack(settings, sim_pool(FAST, 256, 1000.0)) as stack:
            r = connect_sync(stack.redis_url)
            asyncio.run(_drive(stack.dispatcher_addr, ScalingConfig(workflows=8)))  # warm every path
            groups = stack_groups(stack)
            r.config_resetstat()  # the stack's own private Redis: nobody else's counters
            before, t0 = cpu_seconds(groups), time.monotonic()
            done = asyncio.run(_drive(stack.dispatcher_addr, cfg))
            wall = time.monotonic() - t0
            after = cpu_seconds(groups)
            cmds = _commandstats(r)
            memory = _memory_per_stage(r, stack, done)
            socket = stack.redis_url.removeprefix("unix://").split("?")[0]
            shard = _shard_ops(socket, cfg.benchmark_requests)
            r.close()
    stages = len(done)
    by_cmd = Counter({k: v["calls"] / stages for k, v in cmds.items()})
    cpu = {k: round((after[k] - before.get(k, 0.0)) * 1000 / stages, 3) for k in after}
    return {
        "config": asdict(cfg),
        "stages": stages,
        "wall_s": round(wall, 1),
        "stages_per_s": round(stages / wall, 1),
        "redis_commands_per_stage": round(sum(by_cmd.values()), 2),
        "redis_commands_per_stage_by_command": {k: round(v, 2) for k, v in by_cmd.most_common()},
        "redis_exec_usec_per_stage": round(sum(v["usec"] for v in cmds.values()) / stages, 1),
        "cpu_s_per_1k_stages": cpu,
        "redis_bytes_per_finished_stage": round(memory),
        "shard_requests_per_s": shard,
        "engines": "simulated (a measuring instrument), 1000x faster than the profile, 256 sequences each",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workflows", type=int, default=ScalingConfig().workflows)
    args = p.parse_args()
    result = run(ScalingConfig(workflows=args.workflows))
    result["command"] = f"python -m bench.load.scaling --workflows {args.workflows}"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "scaling.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
