"""CPU per stage on uvloop against the standard asyncio loop: the same code, alternated pairs.

``python -m bench.load.event_loop_ab [--pairs N] [--points ...]`` runs ``bench.load.rates`` once with
``CHIMERA_EVENT_LOOP=asyncio`` and once with ``uvloop`` per pair (simulated engines, a measuring instrument;
gRPC door; inline inference), and writes each pair's ratio uvloop/asyncio of the CPU-ms per stage over all
of Chimera's processes, since the shared host drifts between pairs more than within one. Results:
``bench/results/event_loop_ab.{json,md}``, the raw runs in ``bench/results/event_loop_ab/``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics as st
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from bench.common.markdown import table
from bench.common.paths import RESULTS

LOOPS = ("asyncio", "uvloop")


def _run(loop: str, name: str, points: Sequence[str], duration_s: float) -> dict[str, Any]:
    args = ["--points", *points, "--duration", f"{duration_s:g}", "--idle", "3", "--name", name]
    env = {**os.environ, "CHIMERA_EVENT_LOOP": loop}
    subprocess.run(
        [sys.executable, "-m", "bench.load.rates", *args], env=env, check=True, capture_output=True
    )
    run: dict[str, Any] = json.loads((RESULTS / name).with_suffix(".json").read_text())
    (RESULTS / name).with_suffix(".md").unlink()  # the JSON holds it all
    return run


def summarise(pairs: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    points = [r["point"] for r in pairs[0]["asyncio"]["rows"]]
    out: dict[str, Any] = {}
    for i, pt in enumerate(points):
        cost = {loop: [p[loop]["rows"][i]["cpu_ms_per_stage_total"] for p in pairs] for loop in LOOPS}
        ratios = [u / a for a, u in zip(cost["asyncio"], cost["uvloop"], strict=True)]
        out[pt] = {
            "asyncio_ms": cost["asyncio"],
            "uvloop_ms": cost["uvloop"],
            "ratios": [round(r, 3) for r in ratios],
            "median": round(st.median(ratios), 3),
            "min": round(min(ratios), 3),
            "max": round(max(ratios), 3),
        }
    return out


def markdown(res: dict[str, Any]) -> str:
    lines = [
        "# CPU per stage: uvloop against the standard asyncio loop",
        "",
        "Same code, alternated pairs (asyncio, then uvloop), one `bench.load.rates` stack per run: simulated "
        "engines (a measuring instrument), gRPC door, inline inference, one-stage requests, "
        f"{res['duration_s']:g} s per point, the client in its own process and not counted. CPU-ms per stage "
        f"over all of Chimera's processes. Command: `{res['command']}`",
        "",
        *table(
            ["point", "asyncio CPU-ms per stage", "uvloop", "uvloop / asyncio, median", "spread"],
            (
                [
                    pt,
                    " / ".join(f"{v:.2f}" for v in r["asyncio_ms"]),
                    " / ".join(f"{v:.2f}" for v in r["uvloop_ms"]),
                    f"{r['median']:.2f}",
                    f"{r['min']:.2f}-{r['max']:.2f}",
                ]
                for pt, r in res["points"].items()
            ),
        ),
        "",
        "`cN`: N in flight, closed loop; `rN`: Poisson arrivals at N per second.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.load.event_loop_ab", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--points", nargs="+", default=["r50", "r150", "c1", "c16", "c64"])
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per point")
    a = ap.parse_args(argv)
    (RESULTS / "event_loop_ab").mkdir(exist_ok=True)
    pairs = [
        {loop: _run(loop, f"event_loop_ab/{loop}_{k}", a.points, a.duration) for loop in LOOPS}
        for k in range(1, a.pairs + 1)
    ]
    res = {
        "command": "python -m bench.load.event_loop_ab "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "duration_s": a.duration,
        "points": summarise(pairs),
    }
    (RESULTS / "event_loop_ab.json").write_text(json.dumps(res, indent=1) + "\n")
    (RESULTS / "event_loop_ab.md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
