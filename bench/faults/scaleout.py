"""The stack on a Redis Cluster: workflows, then a master killed under load (``make bench-scaleout``).

A cluster of six ``redis-server`` processes on loopback (three masters, a replica each,
``cluster-node-timeout`` 2 s) holds the state of a ``chimera up`` stack over simulated engines
(``bench.faults.stack``'s pool), reached through ``CHIMERA_REDIS_URL=redis+cluster://...``. Two phases on
one stack, each driven by ``bench.faults.drive``'s multi-stage streaming workflows through the SDK and
counted by ``bench.faults.count``:

1. **steady**: a batch of workflows with nothing failing;
2. **failover**: a batch during which, once ``fault_at`` of its stages are answered, the master that serves
   the small engine's slot is SIGKILLed; its replica is promoted by the cluster itself.

Written: ``bench/results/scaleout.json`` and ``.md`` (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common.paths import RESULTS
from bench.faults.count import count
from bench.faults.drive import DriveConfig, Plan, plan, time_to_serve, workflow_client
from bench.faults.stack import Load, StackConfig, drain, marker, pool, traced
from services.common.keys import Keys
from services.common.redis_client import connect_sync
from services.common.redis_cluster_proc import RedisClusterProcs, start_redis_cluster
from services.launcher.config import LauncherSettings
from services.launcher.stack import Stack, running_stack
from services.workload.corpus import embedded_corpus

VICTIM_ENGINE = "small"  # its queue's master is the one killed: the busiest slot of the run


@dataclass(frozen=True, slots=True)
class ScaleoutConfig:
    steady_workflows: int = 24
    failover_workflows: int = 48
    seed: int = 20260501
    stack: StackConfig = StackConfig()
    # Every stage streamed. NOTE(cluster-whole): with half the stages read whole (the fault bench's
    # default), one workflow of 12 failed INTERNAL across a master failover in 2 of 4 runs of the cluster
    # test, not yet explained; until it is, this scenario measures the streamed path it always has.
    drive: DriveConfig = DriveConfig(whole_percent=0)
    node_timeout_ms: int = 2000
    fault_at: float = 0.25  # kill once this share of the failover batch's stages is answered
    fault_latest_s: float = 30.0
    workflow_budget_s: float = 240.0
    recovery_limit_s: float = 60.0
    drain_s: float = 30.0


@dataclass
class Failover:
    """What happened to the cluster: filled in by ``kill_master`` in a thread."""

    victim: int = 0
    replica: int = 0
    fired_at: float | None = None  # monotonic
    promoted_after_s: float | None = None
    notes: list[str] = field(default_factory=list)


def kill_master(cluster: RedisClusterProcs, key: str, out: Failover, limit_s: float = 30.0) -> None:
    """SIGKILL the master serving ``key``, then wait until its replica says it is the master."""
    out.victim = cluster.owner(key)
    replica = cluster.replica_of(out.victim)
    if replica is None:
        out.notes.append("the victim had no live replica")
        return
    out.replica = replica
    cluster.kill(out.victim)
    out.fired_at = time.monotonic()
    while time.monotonic() - out.fired_at < limit_s:
        if cluster.info(replica, "replication").get("role") == "master":
            out.promoted_after_s = round(time.monotonic() - out.fired_at, 2)
            return
        time.sleep(0.05)
    out.notes.append(f"the replica was not promoted within {limit_s:.0f} s")


async def batch(
    stack: Stack, plans: list[Plan], cfg: ScaleoutConfig, cluster: RedisClusterProcs | None
) -> dict[str, Any]:
    """Run ``plans`` at once; with ``cluster``, kill the victim's master mid-run."""
    keys = Keys(stack.key_prefix)
    load = Load(stack.dispatcher_addr, cfg.drive)
    total = sum(p.workflow.n_stages for p in plans)
    failover = Failover()
    t0 = time.monotonic()
    async with workflow_client(stack.dispatcher_addr, cfg.drive) as client:
        tasks = [asyncio.create_task(load.one(client, p, t0 + cfg.workflow_budget_s)) for p in plans]
        recovery: asyncio.Task[float | None] | None = None
        if cluster is not None:
            while (
                load.progress.stages_done < total * cfg.fault_at
                and time.monotonic() - t0 < cfg.fault_latest_s
            ):
                await asyncio.sleep(0.05)
            stages_before = load.progress.stages_done
            fault = asyncio.create_task(
                asyncio.to_thread(kill_master, cluster, keys.queue(VICTIM_ENGINE), failover)
            )
            recovery = asyncio.create_task(
                time_to_serve(
                    stack.dispatcher_addr, cfg.drive, lambda: failover.fired_at, cfg.recovery_limit_s
                )
            )
        await asyncio.gather(*tasks)
        if cluster is not None and recovery is not None:
            await fault
            recovery_s = await recovery
    run_s = round(time.monotonic() - t0, 1)
    left, drained_s = await drain(stack, keys, cfg.drain_s)
    counts = count(load.records, await asyncio.to_thread(traced, stack, keys))
    out: dict[str, Any] = {
        "workflows": len(plans),
        "stages_planned": total,
        "counts": counts.as_dict(),
        "residue": left,
        "drained_after_s": drained_s,
        "run_s": run_s,
        "restarts": {c.name: c.restarts for c in stack.supervisor.children if c.restarts},
    }
    if cluster is not None:
        out["failover"] = {
            "victim_port": failover.victim,
            "promoted_replica_port": failover.replica,
            "fault_after_s": round((failover.fired_at or t0) - t0, 2),
            "stages_answered_before_fault": stages_before,
            "promoted_after_s": failover.promoted_after_s,
            "first_new_workflow_served_after_s": recovery_s,
            "notes": failover.notes,
        }
    return out


async def scenario(stack: Stack, cluster: RedisClusterProcs, cfg: ScaleoutConfig) -> dict[str, Any]:
    """Both phases on one stack; afterwards the killed node is restarted and rejoins as a replica."""
    r = connect_sync(stack.redis_url)
    try:
        r.set(marker(Keys(stack.key_prefix)), "1")
    finally:
        r.close()
    rng = random.Random(cfg.seed)
    problems = embedded_corpus().problems
    steady = plan(problems, cfg.steady_workflows, rng, prefix="steady")
    fail = plan(problems, cfg.failover_workflows, rng, prefix="failover", start=cfg.steady_workflows)
    out = {
        "steady": await batch(stack, steady, cfg, None),
        "failover": await batch(stack, fail, cfg, cluster),
    }
    victim = out["failover"]["failover"]["victim_port"]
    if victim:
        t = time.monotonic()
        cluster.start_node(victim)
        await asyncio.to_thread(cluster.wait_ok, 60.0)
        out["failover"]["failover"]["victim_rejoined_as_replica_after_s"] = round(time.monotonic() - t, 2)
    return out


def run(cfg: ScaleoutConfig, state: Path) -> dict[str, Any]:
    t0 = time.time()
    cluster = start_redis_cluster(state / "cluster", node_timeout_ms=cfg.node_timeout_ms)
    try:
        settings = LauncherSettings.ephemeral(state / "stack", redis_url=cluster.url, start_timeout_s=180)
        with running_stack(settings, pool(cfg.stack)) as stack:
            phases = asyncio.run(scenario(stack, cluster, cfg))
    finally:
        cluster.stop()
    return {
        "what": "the stack on a Redis Cluster (3 masters + 3 replicas on loopback): workflows, then kill -9 "
        "of the master serving the small engine's queue under load",
        "config": asdict(cfg),
        "started_unix": round(t0, 1),
        "wall_s": round(time.time() - t0, 1),
        **phases,
    }


def markdown(res: dict[str, Any]) -> str:
    rows = []
    for phase in ("steady", "failover"):
        p = res[phase]
        c = p["counts"]
        rows.append(
            f"| {phase} | {c['started']} | {c['completed']} | {c['lost']} | {c['duplicated_workflows']} | "
            f"{c['failed_retryable'] + c['failed_other']} | {c['restarted_stages']} | {p['run_s']} | "
            f"{p['drained_after_s']} |"
        )
    f = res["failover"].get("failover", {})
    return "\n".join(
        [
            "# Redis Cluster: workflows and a master failover under load",
            "",
            f"{res['what']}. `make bench-scaleout` ({res['wall_s']} s).",
            "",
            "| phase | workflows | completed | lost | duplicated | failed | restarted stages | run s "
            "| drained s |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"- master killed after {f.get('fault_after_s')} s, with "
            f"{f.get('stages_answered_before_fault')} stages answered; its replica promoted "
            f"{f.get('promoted_after_s')} s after the kill",
            "- a new workflow started after the kill was served "
            f"{f.get('first_new_workflow_served_after_s')} s after it",
            "- the killed node rejoined as a replica "
            f"{f.get('victim_rejoined_as_replica_after_s')} s after its restart",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    defaults = ScaleoutConfig()
    ap.add_argument("--steady", type=int, default=defaults.steady_workflows)
    ap.add_argument("--failover", type=int, default=defaults.failover_workflows)
    ap.add_argument("--out", type=Path, default=RESULTS / "scaleout.json")
    args = ap.parse_args(argv)
    cfg = ScaleoutConfig(steady_workflows=args.steady, failover_workflows=args.failover)
    with tempfile.TemporaryDirectory(prefix="chimera-scaleout-") as tmp:
        res = run(cfg, Path(tmp))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))
    ok = all(
        res[p]["counts"]["lost"] == 0 and res[p]["counts"]["duplicated_workflows"] == 0
        for p in ("steady", "failover")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
