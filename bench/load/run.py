"""Load benchmark: how much the front door holds and what it costs, with engines that are not the bottleneck.

``python -m bench.load`` (``make bench-load``) starts a stack of SIMULATED engines (a measuring instrument:
they stand in for GPUs so that only Chimera's own processes are measured) and drives it from a client in its
own process (``bench.load.client``). Phases:

1. **throughput**: one-stage requests back to back at 1, 16, 64 and 256 in flight, through gRPC and HTTP;
   stages/s, ``dispatch_ms`` p50/p99, and the CPU-seconds each process spent per 1,000 stages. The engines
   run 256 sequences each, 1000 times faster than the profile: they never queue. ``--inference remote
   inline`` runs this phase once per place the router and predictor models run (their services, or inside
   the dispatcher), each on a fresh stack, one after the other.
2. **streams**: thousands of streams opened at once and held while tokens trickle (one token a second and a
   half): the most open at the same time and every error. The engines have room for all of them.
3. **overload** (only when the dispatcher bounds its queues): the pool's capacity is measured first (closed
   loop at its saturation), then requests arrive at ten times that rate; completed, browned out, refused
   (429 / RESOURCE_EXHAUSTED, with or without ``Retry-After``), other errors, and the admitted requests'
   queue wait against the bound.

Results go to ``bench/results/<name>.json`` and ``.md``. CPU figures are per process, from ``psutil``, over
each phase alone; the client's own process is not counted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench.common.paths import RESULTS
from bench.common.procs import cpu_seconds, stack_groups
from bench.load.client import Phase
from bench.load.report import write_results
from services.common.types import EngineProfile
from services.launcher.config import LauncherSettings
from services.launcher.pool import EngineSpec, PoolSpec
from services.launcher.stack import Stack, running_stack

log = logging.getLogger("bench.load.run")


@dataclass(frozen=True, slots=True)
class LoadConfig:
    name: str = "load"
    concurrencies: tuple[int, ...] = (1, 16, 64, 256)
    # Open-loop Poisson arrivals per second for the throughput phase, after the closed ones: CPU per stage at
    # a load the host carries with room to spare, where it measures the work per stage rather than how the
    # processes share a saturated host (which moves a closed run's figure by a quarter from run to run).
    rates: tuple[float, ...] = ()
    doors: tuple[str, ...] = ("grpc", "http")
    duration_s: float = 10.0
    streams: int = 5000
    # Opened over 90 s: a 2-core machine opens about a hundred workflows a second at most while it also
    # relays the tokens of those already open; faster, the gRPC door's own queue times out callers.
    stream_ramp_s: float = 90.0
    stream_tokens: int = 16
    # The streams stack's queue bound (predicted seconds per engine): far above what 5,000 streams hold,
    # so every stream is admitted and the phase measures holding, not shedding.
    stream_bound_s: float = 86400.0  # the most the setting allows
    overload: bool = True
    overload_factor: float = 10.0
    overload_s: float = 20.0
    # The overload run's gRPC client: "none" counts the door's answers; "default" is the SDK's RetryPolicy.
    overload_retry: str = "none"
    # The overload stack's queue bound: a few seconds of a small pool's work.
    overload_bound_s: float = 5.0
    # Extra dispatcher settings for every stack (e.g. the admission bounds).
    dispatcher_env: tuple[tuple[str, str], ...] = ()
    phases: tuple[str, ...] = ("throughput", "streams", "overload")
    # Where the dispatcher runs the router and predictor (LauncherSettings.inference): the throughput phase
    # runs once per mode, each on its own stack, side by side in one run; the other phases use the first.
    inference: tuple[str, ...] = ("remote",)


def _engine(eid: str, model: str, profile: EngineProfile, seqs: int, time_scale: float) -> EngineSpec:
    # The worker's own length model is set far above max_tokens: every request produces exactly max_tokens.
    return EngineSpec(
        id=eid,
        model=model,
        kind="simulated",
        max_num_seqs=seqs,
        stand_in="qwen2.5-1.5b",
        env={
            "time_scale": f"{time_scale:g}",
            "profile_json": profile.to_json(),
            "sim_length_median": "1e9",
            "sim_length_sigma": "0",
        },
    )


def sim_pool(profile: EngineProfile, seqs: int, time_scale: float) -> PoolSpec:
    """Two simulated engines (a measuring instrument): ``sim-small`` on ``profile``, ``sim-big`` decoding at
    half its speed."""
    return PoolSpec(
        engines=(
            _engine("fast", "sim-small", profile, seqs, time_scale),
            _engine(
                "slow",
                "sim-big",
                replace(profile, decode_ms_per_token=profile.decode_ms_per_token * 2),
                seqs,
                time_scale,
            ),
        )
    )


# Throughput: a 1.5B-like step curve, run 1000x faster than profiled, 256 sequences: never the bottleneck.
FAST = EngineProfile(8.0, 256, 0.0, ((1, 8.0), (256, 16.0)))
# Streams: one token every 8 s whatever the batch, so all 5,000 streams (16 tokens, about two minutes each)
# are open together at the end of the ramp.
TRICKLE = EngineProfile(8000.0, 4096, 0.0, ((1, 8000.0), (4096, 8000.0)))
# Overload: a small pool with a finite capacity (8 sequences per engine, 20 ms steps).
SMALL = EngineProfile(20.0, 8, 0.0, ((1, 20.0), (8, 20.0)))


def run_phase(phase: Phase, groups: Mapping[str, tuple[int, bool]]) -> dict[str, Any]:
    """Run one phase in a client process; the result with the CPU each stack process spent meanwhile."""
    before = cpu_seconds(groups)
    client_before = _children_cpu_s()
    proc = subprocess.run(
        [sys.executable, "-m", "bench.load.client"],
        input=json.dumps(asdict(phase)),
        capture_output=True,
        text=True,
        check=False,
    )
    after = cpu_seconds(groups)
    client_cpu_s = _children_cpu_s() - client_before
    if proc.returncode != 0:
        raise RuntimeError(f"load client failed: {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    cpu = {k: round(after[k] - before.get(k, 0.0), 3) for k in after}
    result["cpu_s"] = cpu
    # The client's own CPU, not counted in Chimera's: a client near a whole core is the bottleneck itself.
    result["client_cpu_s"] = round(client_cpu_s, 3)
    result["client_cores"] = round(client_cpu_s / max(1e-9, result["elapsed_s"]), 3)
    stages = max(1, result["ok"])
    result["cpu_s_per_1k_stages"] = {k: round(v * 1000 / stages, 3) for k, v in cpu.items()}
    result["cpu_s_per_1k_stages_total"] = round(sum(cpu.values()) * 1000 / stages, 3)
    log.info(
        "%s %s c=%s n=%s: %.1f stages/s, %s, dispatch p50 %.1f ms p99 %.1f ms, %.2f CPU-s/1k stages, "
        "client %.2f cores",
        phase.kind,
        phase.door,
        phase.concurrency,
        phase.streams or result["requests"],
        result["stages_per_s"],
        result["by_status"],
        result["dispatch_ms_p50"],
        result["dispatch_ms_p99"],
        result["cpu_s_per_1k_stages_total"],
        result["client_cores"],
    )
    return result


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


@contextlib.contextmanager
def _stack(
    state: Path, pool: PoolSpec, cfg: LoadConfig, bound_s: float | None = None, inference: str = ""
) -> Iterator[tuple[Stack, dict[str, tuple[int, bool]]]]:
    mode = inference or cfg.inference[0]
    settings = LauncherSettings.ephemeral(state, start_timeout_s=300, inference=mode)
    env = dict(cfg.dispatcher_env)
    if bound_s is not None:
        env["CHIMERA_DISPATCHER_MAX_QUEUE_S"] = f"{bound_s:g}"
    with running_stack(settings, pool, dispatcher_env=env) as stack:
        yield stack, stack_groups(stack)


def phase_on(stack: Stack, **kw: Any) -> Phase:
    """A load client's phase against ``stack``'s doors."""
    return Phase(grpc_addr=stack.dispatcher_addr, http_addr=stack.http_addr, **kw)


@contextlib.contextmanager
def throughput_stack(
    state: Path, cfg: LoadConfig, mode: str
) -> Iterator[tuple[Stack, dict[str, tuple[int, bool]]]]:
    """The throughput phase's stack (engines that never queue, ``mode`` inference), warmed up."""
    with _stack(state, sim_pool(FAST, 256, 1000.0), cfg, inference=mode) as (stack, groups):
        run_phase(phase_on(stack, kind="closed", door="grpc", concurrency=16, duration_s=3.0), groups)
        yield stack, groups


def throughput(cfg: LoadConfig, state: Path) -> list[dict[str, Any]]:
    out, dur = [], cfg.duration_s
    for mode in cfg.inference:
        with throughput_stack(state / f"throughput-{mode}", cfg, mode) as (stack, groups):
            for door in cfg.doors:
                for c in cfg.concurrencies:
                    phase = phase_on(stack, kind="closed", door=door, concurrency=c, duration_s=dur)
                    out.append({"inference": mode, **run_phase(phase, groups)})
                for rate in cfg.rates:
                    phase = phase_on(stack, kind="open", door=door, rate=rate, duration_s=dur)
                    out.append({"inference": mode, **run_phase(phase, groups)})
    return out


def streams(cfg: LoadConfig, state: Path) -> list[dict[str, Any]]:
    out = []
    seqs = min(4096, cfg.streams)  # the most a worker takes; two engines hold 8192
    for door in cfg.doors:
        stack_cm = _stack(state / f"streams-{door}", sim_pool(TRICKLE, seqs, 1.0), cfg, cfg.stream_bound_s)
        with stack_cm as (stack, groups):
            phase = phase_on(
                stack, kind="streams", door=door, streams=cfg.streams, ramp_s=cfg.stream_ramp_s,
                max_tokens=cfg.stream_tokens,
            )  # fmt: skip
            out.append(run_phase(phase, groups))
    return out


def overload(cfg: LoadConfig, state: Path) -> dict[str, Any]:
    with _stack(state / "overload", sim_pool(SMALL, 8, 1.0), cfg, cfg.overload_bound_s) as (stack, groups):
        cap = run_phase(
            phase_on(stack, kind="closed", door="grpc", concurrency=64, duration_s=cfg.duration_s), groups
        )
        rate = cap["stages_per_s"] * cfg.overload_factor
        runs = {
            door: run_phase(
                phase_on(
                    stack,
                    kind="open",
                    door=door,
                    rate=rate,
                    duration_s=cfg.overload_s,
                    retry=cfg.overload_retry,
                ),
                groups,
            )
            for door in cfg.doors
        }
    return {
        "capacity_stages_per_s": cap["stages_per_s"],
        "rate": rate,
        "bound_s": cfg.overload_bound_s,
        "capacity_run": cap,
        **runs,
    }


def run(cfg: LoadConfig) -> dict[str, Any]:
    result: dict[str, Any] = {"config": asdict(cfg)}
    with tempfile.TemporaryDirectory(prefix="chimera-load-") as tmp:
        state = Path(tmp)
        if "throughput" in cfg.phases:
            result["throughput"] = throughput(cfg, state)
        if "streams" in cfg.phases:
            result["streams"] = streams(cfg, state)
        if cfg.overload and "overload" in cfg.phases:
            result["overload"] = overload(cfg, state)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    d = LoadConfig()
    ap = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", default=d.name, help="result file stem in bench/results/")
    ap.add_argument("--duration", type=float, default=d.duration_s, help="seconds per throughput phase")
    ap.add_argument("--streams", type=int, default=d.streams)
    ap.add_argument("--concurrencies", type=int, nargs="+", default=list(d.concurrencies))
    ap.add_argument("--rates", type=float, nargs="+", default=list(d.rates), help="open-loop arrivals/s")
    ap.add_argument("--doors", nargs="+", default=list(d.doors), choices=["grpc", "http"])
    ap.add_argument("--no-overload", action="store_true")
    ap.add_argument("--phases", nargs="+", default=["throughput", "streams", "overload"])
    ap.add_argument(
        "--inference", nargs="+", default=list(d.inference), choices=["remote", "inline"],
        help="where the dispatcher runs the router and predictor; the throughput phase runs once per mode",
    )  # fmt: skip
    ap.add_argument("--overload-s", type=float, default=d.overload_s, help="seconds of 10x arrivals")
    ap.add_argument(
        "--overload-retry", default=d.overload_retry, choices=["none", "default"],
        help="the overload run's gRPC client: no retries, or the SDK's default RetryPolicy",
    )  # fmt: skip
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a dispatcher setting")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    env = tuple(tuple(kv.split("=", 1)) for kv in args.set)
    cfg = LoadConfig(
        name=args.name,
        concurrencies=tuple(args.concurrencies),
        rates=tuple(args.rates),
        doors=tuple(args.doors),
        duration_s=args.duration,
        streams=args.streams,
        overload=not args.no_overload,
        overload_s=args.overload_s,
        overload_retry=args.overload_retry,
        dispatcher_env=env,
        phases=tuple(args.phases),
        inference=tuple(args.inference),
    )
    started = time.perf_counter()
    result = run(cfg)
    result["runtime_s"] = round(time.perf_counter() - started, 1)
    result["command"] = "python -m bench.load " + " ".join(argv if argv is not None else sys.argv[1:])
    write_results(result, RESULTS / cfg.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
