"""Fault benchmark: what clients of a loaded stack see when one of its processes dies or stalls.

``python -m bench.faults`` (``make bench-faults``): for each fault kind a fresh stack (simulated engines:
a measuring instrument), N concurrent multi-stage streaming workflows through the gRPC door, one fault
mid-load, then the counts (completed, failed with a retryable code, failed otherwise, lost, duplicated
text), the time until new work is served again, and the accounting left in Redis after the drain.

``python -m bench.faults --soak --minutes 20`` (``make soak``): one stack, workflows kept in flight, a
random fault every 30-60 s; the same counts under the "soak" key of the same results.

Everything is loopback and bounded in time; only processes this benchmark started are signalled, and all
of them are stopped on exit, also on Ctrl-C and SIGTERM. Results: bench/results/faults.json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import logging
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

from bench.common.paths import RESULTS
from bench.faults.drive import DriveConfig, plan
from bench.faults.inject import DISPATCHERS, FAULTS, FaultEnv
from bench.faults.report import write
from bench.faults.soak import SoakConfig, run_soak
from bench.faults.stack import RunConfig, StackConfig, fault_stack, run_one_fault
from services.workload.corpus import embedded_corpus

log = logging.getLogger("bench.faults.run")
RUN, STACK, DRIVE, SOAK = RunConfig(), StackConfig(), DriveConfig(), SoakConfig()  # the defaults
ENVS: list[FaultEnv] = []  # the live one, so that a signal can stop its waits


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "services"], capture_output=True, text=True
        )
        return out.stdout.strip() + ("+uncommitted services/ changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _meta(cfg: RunConfig, started: float) -> dict[str, Any]:
    return {
        "commit": _commit(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python -m bench.faults", *sys.argv[1:]]),
        "workflows": cfg.workflows,
        "seed": cfg.seed,
        "time_scale": cfg.stack.time_scale,
        "lease_s": cfg.stack.lease_s,
        "max_tokens": cfg.drive.max_tokens,
        "run_s": round(time.monotonic() - started, 1),
    }


def run_kinds(kinds: list[str], cfg: RunConfig, state: Path) -> dict[str, dict[str, Any]]:
    problems = embedded_corpus().problems
    rows: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        # The same workflows for every kind, so that rows differ by the fault alone.
        plans = plan(problems, cfg.workflows, random.Random(cfg.seed))
        log.info("%s: starting a stack", kind)
        arm, fronts = kind == "engine_crash", DISPATCHERS.get(kind, 1)
        with fault_stack(state / kind, cfg.stack, arm_crash=arm, dispatchers=fronts) as (stack, env):
            ENVS[:] = [env]
            row = asyncio.run(run_one_fault(stack, env, kind, plans, cfg))
        row["commit"] = _commit()
        rows[kind] = row
        c = row["counts"]
        log.info(
            "%s: %d started, %d completed, %d failed retryable, %d failed other, %d lost, %d dup stages, "
            "%d traced twice; serves again after %s s; residue %s",
            kind, c["started"], c["completed"], c["failed_retryable"], c["failed_other"], c["lost"],
            c["duplicated_stages"], c["traced_twice"], row["recovery_s"], row["residue"] or "none",
        )  # fmt: skip
    return rows


def run_soak_once(soak: SoakConfig, cfg: RunConfig, state: Path) -> dict[str, Any]:
    stack_cm = fault_stack(state / "soak", cfg.stack, arm_crash=soak.arms_crash, dispatchers=soak.dispatchers)
    with stack_cm as (stack, env):
        ENVS[:] = [env]
        return asyncio.run(run_soak(stack, env, embedded_corpus().problems, cfg, soak))


def _stop(signum: int, _frame: FrameType | None) -> None:
    # SIGTERM behaves like Ctrl-C: unwind, so that every context manager stops its processes.
    for env in ENVS:
        env.stopping.set()
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", nargs="+", choices=list(FAULTS), default=list(FAULTS))
    ap.add_argument("--workflows", type=int, default=16, help="concurrent workflows per fault kind")
    ap.add_argument("--seed", type=int, default=RUN.seed)
    ap.add_argument("--max-tokens", type=int, default=DRIVE.max_tokens)
    ap.add_argument("--time-scale", type=float, default=STACK.time_scale)
    ap.add_argument("--lease-s", type=float, default=STACK.lease_s)
    ap.add_argument("--soak", action="store_true", help="the soak instead of one fault per stack")
    ap.add_argument("--minutes", type=float, default=SOAK.minutes, help="soak length")
    ap.add_argument("--concurrency", type=int, default=SOAK.concurrency, help="soak: workflows in flight")
    ap.add_argument(
        "--every",
        type=float,
        nargs=2,
        default=list(SOAK.every_s),
        metavar=("LO", "HI"),
        help="soak: a fault every uniform(LO, HI) seconds",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--state-dir", type=Path, default=None, help="keep logs and Redis dirs here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = RunConfig(
        workflows=args.workflows,
        seed=args.seed,
        stack=StackConfig(time_scale=args.time_scale, lease_s=args.lease_s),
        drive=replace(DRIVE, max_tokens=args.max_tokens),
    )
    signal.signal(signal.SIGTERM, _stop)
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="chimera-faults-"))
    started = time.monotonic()
    lost = 0  # a run that lost work keeps its logs and Redis data, for whoever looks into it
    try:
        if args.soak:
            lo, hi = args.every
            soak = SoakConfig(
                minutes=args.minutes, concurrency=args.concurrency, every_s=(lo, hi), kinds=tuple(args.kinds)
            )
            result = run_soak_once(soak, cfg, state)
            lost = result["counts"]["lost"]
            write(args.out, "soak", {**result, "meta": _meta(cfg, started)})
        else:
            rows = run_kinds(args.kinds, cfg, state)
            lost = sum(row["counts"]["lost"] for row in rows.values())
            write(args.out, "kinds", {"meta": _meta(cfg, started), "kinds": rows})
    except KeyboardInterrupt:
        log.warning("stopped; every process this run started is stopped")
        return 130
    finally:
        if args.state_dir is None and not lost:
            shutil.rmtree(state, ignore_errors=True)
    if lost:
        log.warning("%d workflows lost: the logs and Redis data of the run are kept in %s", lost, state)
    log.info("results in %s (%.0f s)", args.out / "faults.md", time.monotonic() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
