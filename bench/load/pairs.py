"""Per-stage CPU of two commits side by side, from alternated ``bench.load.run`` runs (one-off summary).

Reads ``<dir>/start_K.json`` (run in a git worktree of the earlier commit) and ``<dir>/now_K.json`` (run here,
right after it), and writes ``<dir>.md``: each pair's ratio now/start for every load point and place of
inference, and each process's median CPU per stage. ``bench.load.ab`` does the same against f742f5a
(its "before" side ran remote inference only); this one compares two commits that both have the
``--inference`` switch.

Usage: ``python -m bench.load.pairs <folder of start_K.json and now_K.json> --start <earlier commit>``
"""

# ruff: noqa: E501  (the report's sentences are kept whole)
from __future__ import annotations

import argparse
import json
import statistics as st
from collections.abc import Sequence
from pathlib import Path
from typing import Any

COMMAND = "alternated: (cd <worktree of START with this checkout's generated protos> && python -m bench.load --name st_before_K --phases throughput --no-overload --doors grpc --concurrencies 1 16 --rates 50 150 --inference inline remote); python -m bench.load --name st_after_K <the same options>"


def _points(run: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for r in run["throughput"]:
        ph = r["phase"]
        point = f"{ph['concurrency']} in flight" if ph["kind"] == "closed" else f"{ph['rate']:g}/s"
        out[(r["inference"], point)] = r
    return out


def report(folder: Path, start: str) -> str:
    pairs = []
    for now_file in sorted(folder.glob("now_*.json")):
        before = json.loads((folder / now_file.name.replace("now", "start")).read_text())
        pairs.append((_points(before), _points(json.loads(now_file.read_text()))))
    keys = sorted(pairs[0][0], key=lambda k: (k[0], k[1]))
    lines = [
        f"# CPU per stage: `{start}` against this checkout, {len(pairs)} alternated pairs",
        "",
        "Simulated engines (a measuring instrument), gRPC door, one-stage requests, 10 s per load point, the client in its own process and not counted. CPU-seconds per 1,000 stages over all of Chimera's processes; each pair ran the earlier commit, then this one, back to back, so the ratio within a pair is the figure to read on this shared host.",
        "",
        f"Command: {COMMAND.replace('START', start)}; then `python -m bench.load.pairs {folder} --start {start}`.",
        "",
        "| load | inference | now / start, median | pairs |",
        "|---|---|---|---|",
    ]
    for key in keys:
        ratios = [
            now[key]["cpu_s_per_1k_stages_total"] / before[key]["cpu_s_per_1k_stages_total"]
            for before, now in pairs
        ]
        lines.append(
            f"| {key[1]} | {key[0]} | {st.median(ratios):.2f} | {', '.join(f'{r:.2f}' for r in ratios)} |"
        )
    lines += [
        "",
        "Each process's median CPU-s per 1,000 stages:",
        "",
        "| load | inference | process | start | now |",
        "|---|---|---|---|---|",
    ]
    for key in keys:
        names = sorted(
            {n for b, a in pairs for n in (*b[key]["cpu_s_per_1k_stages"], *a[key]["cpu_s_per_1k_stages"])}
        )
        for name in names:
            s0 = st.median(b[key]["cpu_s_per_1k_stages"].get(name, 0.0) for b, _ in pairs)
            s1 = st.median(a[key]["cpu_s_per_1k_stages"].get(name, 0.0) for _, a in pairs)
            lines.append(f"| {key[1]} | {key[0]} | {name} | {s0:.2f} | {s1:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.load.pairs", description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="holds start_K.json and now_K.json")
    ap.add_argument("--start", required=True, help="the earlier commit, for the report")
    a = ap.parse_args(argv)
    text = report(a.folder, a.start)
    a.folder.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
