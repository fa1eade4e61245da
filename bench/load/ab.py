"""Per-stage CPU of f742f5a (the code before the per-stage CPU work) against this checkout, from alternated
``bench.load.run`` runs (one-off summary).

Reads ``ab_before_K.json`` (run in a worktree of f742f5a, see the command below) and ``ab_after_K.json``
(run here), copies both into ``bench/results/load_stage_cpu_ab/`` and writes ``load_stage_cpu_ab.{json,md}``:
each pair's ratio after/before, because the shared host's speed drifts between pairs more than within one.

Usage: ``python -m bench.load.ab [<worktree of f742f5a>] [--name STEM]`` (without a worktree: the summary again
from the committed runs). ``--name`` keeps another set of pairs apart: its raw runs go to
``bench/results/<STEM>/`` and its summary to ``<STEM>.{json,md}`` (default ``load_stage_cpu_ab``).
"""

# ruff: noqa: E501  (the report's sentences are kept whole)
from __future__ import annotations

import argparse
import json
import shutil
import statistics as st
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

OUT = Path("bench/results")
COMMAND = "alternated: (cd <worktree of f742f5a with today's bench/load*.py, bench/common/procs.py, chimera_client and generated protos copied in> && python -m bench.load --name ab_before_K --phases throughput --no-overload --doors grpc --concurrencies 1 16 64 --rates 50 150); python -m bench.load --name ab_after_K --phases throughput --no-overload --doors grpc --concurrencies 1 16 64 --rates 50 150 --inference remote inline"


def _collect(before_dir: Path | None, raw: Path) -> None:
    """Copy a fresh set of runs into ``raw`` (before: from the worktree; after: from ``OUT``)."""
    raw.mkdir(exist_ok=True)
    for after in sorted(OUT.glob("ab_after_*.json")):
        before = before_dir / after.name.replace("after", "before") if before_dir else None
        if before is not None and before.exists():
            shutil.copy(before, raw / before.name)
            shutil.move(after, raw / after.name)
            after.with_suffix(".md").unlink(
                missing_ok=True
            )  # bench.load.run's own report; the JSON has it all


def _row(before: dict[str, Any], after: dict[str, Any], k: int) -> dict[str, Any]:
    """CPU-s per 1k stages of one pair, keyed ``before_c<n>``, ``remote_c<n>``, ``inline_c<n>``, and the same
    per process under ``by_process``."""
    row: dict[str, Any] = {"pair": k, "by_process": {}}
    for side, d in (("before", before), ("after", after)):
        for r in d["throughput"]:
            ph = r["phase"]
            point = f"c{ph['concurrency']}" if ph["kind"] == "closed" else f"r{ph['rate']:g}"
            key = f"{side if side == 'before' else r['inference']}_{point}"
            row[key] = r["cpu_s_per_1k_stages_total"]
            row["by_process"][key] = r["cpu_s_per_1k_stages"]
    return row


def _process_medians(pairs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per run kind (``before_c16``...), each process's median CPU-s per 1k stages over the pairs."""
    out: dict[str, dict[str, float]] = {}
    for key in pairs[0]["by_process"]:
        procs = {name for p in pairs for name in p["by_process"][key]}
        out[key] = {n: st.median(p["by_process"][key].get(n, 0.0) for p in pairs) for n in sorted(procs)}
    return out


def _points(pairs: list[dict[str, Any]]) -> list[str]:
    """The load points every pair ran: ``c<n>`` (closed, n in flight) and ``r<rate>`` (open, arrivals/s)."""
    keys = set.intersection(*(set(p) for p in pairs))
    points = {k.split("_", 1)[1] for k in keys if k.startswith("before_")}
    return sorted(points, key=lambda x: (x[0], float(x[1:])))


def summarise(raw: Path) -> dict[str, Any]:
    pairs = []
    for before in sorted(raw.glob("ab_before_*.json")):
        after = raw / before.name.replace("before", "after")
        k = int(before.stem.rsplit("_", 1)[1])
        pairs.append(_row(json.loads(before.read_text()), json.loads(after.read_text()), k))
    summary = {}
    for c in _points(pairs):
        for mode in ("remote", "inline"):
            ratios = [p[f"{mode}_{c}"] / p[f"before_{c}"] for p in pairs]
            summary[f"{mode}_{c}"] = {
                "median": st.median(ratios),
                "min": min(ratios),
                "max": max(ratios),
                "ratios": ratios,
            }
    return {
        "command": COMMAND,
        "pairs": pairs,
        "ratio_after_over_before": summary,
        "process_medians": _process_medians(pairs),
        "target": "<= 0.5",
    }


def markdown(res: dict[str, Any]) -> str:
    before_1 = [p["before_c1"] for p in res["pairs"]]
    points = _points(res["pairs"])
    label = {c: f"c={c[1:]}" if c[0] == "c" else f"{c[1:]}/s" for c in points}
    lines = [
        "# CPU per stage: f742f5a (before the per-stage CPU work) against this checkout, alternated pairs",
        "",
        "Simulated engines (a measuring instrument), gRPC door, one-stage requests back to back, 10 s per concurrency, the client in its own process and not counted. CPU-seconds per 1,000 stages over all of Chimera's processes (dispatcher, workers, Redis, router and predictor when remote). The code before is `f742f5a` (the code before the per-stage CPU work), run from a git worktree with today's benchmark files, SDK and generated protos copied in (the wire format is compatible); today's code runs with the router and predictor as services (`remote`) and inside the dispatcher (`inline`). Each pair: before, then after, back to back. The host is shared and noisy "
        f"(the before-runs alone ranged {min(before_1):.1f}-{max(before_1):.1f} CPU-s per 1k stages at 1 in flight), so the ratio within a pair is the figure to read.",
        "",
        f"Command: {res['command']}",
        "",
        "Load points: `c=N` is N requests in flight back to back (closed loop; the host is saturated from 16 on, so the figure also reflects how the processes share it); `N/s` is Poisson arrivals at N per second (open loop, with room to spare: the work per stage, and the steadiest figure).",
        "",
        "| pair | "
        + " | ".join(f"before {label[c]} | remote {label[c]} | inline {label[c]}" for c in points)
        + " |",
        "|---|" + "---|---|---|" * len(points),
    ]
    for p in res["pairs"]:
        cells = (f"{p[f'before_{c}']:.2f} | {p[f'remote_{c}']:.2f} | {p[f'inline_{c}']:.2f}" for c in points)
        lines.append(f"| {p['pair']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## After / before, per pair (target: at most 0.5)",
        "",
        "| load | remote median | spread | inline median | spread |",
        "|---|---|---|---|---|",
    ]
    for c in points:
        r, i = (res["ratio_after_over_before"][f"{m}_{c}"] for m in ("remote", "inline"))
        lines.append(
            f"| {label[c]} | {r['median']:.2f} | {r['min']:.2f}-{r['max']:.2f} | {i['median']:.2f} | {i['min']:.2f}-{i['max']:.2f} |"
        )
    medians = res["process_medians"]
    procs = sorted({n for m in medians.values() for n in m})
    lines += [
        "",
        "## Where it goes: each process's median CPU-s per 1,000 stages",
        "",
        "The workers host the simulated engines, so their figures include the instrument's own steps (the same code on both sides).",
        "",
        "| run | " + " | ".join(procs) + " |",
        "|---|" + "---|" * len(procs),
    ]
    for key, m in medians.items():
        lines.append(f"| {key} | " + " | ".join(f"{m[n]:.2f}" if n in m else "-" for n in procs) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.load.ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("worktree", nargs="?", type=Path, help="the worktree the before-runs ran in")
    ap.add_argument(
        "--name", default="load_stage_cpu_ab", help="stem of the raw folder and the summary files"
    )
    args = ap.parse_args(argv)
    raw = OUT / args.name
    _collect(args.worktree / "bench" / "results" if args.worktree else None, raw)
    res = summarise(raw)
    (OUT / f"{args.name}.json").write_text(json.dumps(res, indent=1) + "\n")
    (OUT / f"{args.name}.md").write_text(markdown(res))
    sys.stdout.write(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
