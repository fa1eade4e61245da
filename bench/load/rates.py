"""Why a stage costs more CPU at low arrival rates: one stack, one load point after another, each process's
CPU per stage beside the Redis commands per stage (``INFO commandstats``) and the stack's idle CPU.

``python -m bench.load.rates`` (simulated engines, a measuring instrument, as in ``bench.load.run``'s
throughput phase; gRPC door; inline inference unless ``--inference remote``). If the commands per stage stay
flat while the CPU per stage falls with the rate, the extra cost at low rates is not more work per stage but
its fixed costs (the idle loops, and each process waking up for every event) shared by fewer stages.
Results: ``bench/results/load_rates.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common.markdown import table
from bench.common.paths import RESULTS
from bench.common.procs import cpu_seconds
from bench.load.run import LoadConfig, phase_on, run_phase, throughput_stack
from services.common.redis_client import connect_sync


def _calls(stats: dict[str, Any]) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def measure(points: Sequence[str], inference: str, duration_s: float, idle_s: float) -> dict[str, Any]:
    """``points``: "cN" (N in flight, closed loop) or "rN" (N arrivals/s, open loop)."""
    cfg = LoadConfig(inference=(inference,))
    rows = []
    with tempfile.TemporaryDirectory(prefix="chimera-load-rates-") as tmp:
        with throughput_stack(Path(tmp), cfg, inference) as (stack, groups):
            time.sleep(1.0)
            c0 = cpu_seconds(groups)
            time.sleep(idle_s)
            c1 = cpu_seconds(groups)
            idle = {k: round((c1[k] - c0[k]) * 1000 / idle_s, 2) for k in c1}
            r = connect_sync(stack.redis_url, socket_timeout=5.0)
            try:
                for pt in points:
                    n = float(pt[1:])
                    kind = {"c": "closed", "r": "open"}[pt[0]]
                    load = {"concurrency": int(n)} if kind == "closed" else {"rate": n}
                    before = _calls(r.info("commandstats"))
                    phase = phase_on(stack, kind=kind, door="grpc", duration_s=duration_s, **load)
                    res = run_phase(phase, groups)
                    after = _calls(r.info("commandstats"))
                    stages = max(1, res["ok"])
                    per_stage = {k: (v - before.get(k, 0)) / stages for k, v in after.items()}
                    rows.append(
                        {
                            "point": pt,
                            "stages_per_s": res["stages_per_s"],
                            "errors": res["requests"] - res["ok"],
                            "cpu_ms_per_stage": res["cpu_s_per_1k_stages"],
                            "cpu_ms_per_stage_total": res["cpu_s_per_1k_stages_total"],
                            "idle_share_ms_per_stage": round(sum(idle.values()) / res["stages_per_s"], 3),
                            "redis_commands_per_stage": round(sum(per_stage.values()), 2),
                            "redis_commands": {k: round(v, 2) for k, v in per_stage.items() if v >= 0.05},
                        }
                    )
            finally:
                r.close()
    return {"inference": inference, "duration_s": duration_s, "idle_cpu_ms_per_s": idle, "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    idle = result["idle_cpu_ms_per_s"]
    lines = [
        "# CPU per stage against the arrival rate, with Redis commands per stage",
        "",
        f"Simulated engines (a measuring instrument), gRPC door, {result['inference']} inference, "
        f"{result['duration_s']:g} s per point, one stack. `{result['command']}`",
        "",
        f"Idle CPU-ms per second, the stack with no traffic: {idle} (total {sum(idle.values()):.1f}).",
        "",
    ]
    rows = []
    for row in result["rows"]:
        cpu = row["cpu_ms_per_stage"]
        workers = sum(v for k, v in cpu.items() if k.startswith("worker"))
        rows.append(
            [
                row["point"],
                f"{row['stages_per_s']:.0f}",
                str(row["errors"]),
                f"{row['cpu_ms_per_stage_total']:.2f}",
                f"{row['idle_share_ms_per_stage']:.2f}",
                f"{row['redis_commands_per_stage']:.1f}",
                f"{cpu.get('dispatcher', 0.0):.2f}",
                f"{workers:.2f}",
                f"{cpu.get('redis', 0.0):.2f}",
            ]
        )
    header = ["point", "stages/s", "errors", "CPU-ms per stage", "of which idle"]
    header += ["Redis commands per stage", "dispatcher", "workers", "redis"]
    lines += [
        *table(header, rows),
        "",
        "`cN`: N requests in flight back to back; `rN`: Poisson arrivals at N per second.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.load.rates", description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", nargs="+", default=["r25", "r50", "r100", "r200", "c1", "c16"])
    ap.add_argument("--inference", default="inline", choices=["inline", "remote"])
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per point")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of no traffic measured first")
    ap.add_argument("--name", default="load_rates", help="result file stem in bench/results/")
    args = ap.parse_args(argv)
    result = measure(args.points, args.inference, args.duration, args.idle)
    result["command"] = "python -m bench.load.rates " + " ".join(argv if argv is not None else sys.argv[1:])
    out = RESULTS / args.name
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
