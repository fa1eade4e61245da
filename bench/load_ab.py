"""Per-stage CPU, before issue 12 against today, from alternated ``bench.load`` runs (one-off summary).

Reads ``ab_before_K.json`` (run in a worktree of f742f5a, see the command below) and ``ab_after_K.json``
(run here), copies both into ``bench/results/load_stage_ab/`` and writes ``load_stage_ab.{json,md}``: each
pair's ratio after/before, because the shared host's speed drifts between pairs more than within one.

Usage: ``python -m bench.load_ab [<worktree of f742f5a>]`` (without it: the summary again from the committed runs)
"""

# ruff: noqa: E501  (the report's sentences are kept whole)
from __future__ import annotations

import json
import shutil
import statistics as st
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

OUT = Path("bench/results")
RAW = OUT / "load_stage_ab"
CONCURRENCIES = (1, 16, 64)
COMMAND = "alternated: (cd <worktree of f742f5a with today's bench/load*.py, bench/overhead_procs.py, chimera_client and generated protos copied in> && python -m bench.load --name ab_before_K --phases throughput --no-overload --doors grpc --concurrencies 1 16 64); python -m bench.load --name ab_after_K --phases throughput --no-overload --doors grpc --concurrencies 1 16 64 --inference remote inline"


def _collect(before_dir: Path | None) -> None:
    """Copy a fresh session's runs into ``RAW`` (before: from the worktree; after: from ``OUT``)."""
    RAW.mkdir(exist_ok=True)
    for after in sorted(OUT.glob("ab_after_*.json")):
        before = before_dir / after.name.replace("after", "before") if before_dir else None
        if before is not None and before.exists():
            shutil.copy(before, RAW / before.name)
            shutil.move(after, RAW / after.name)


def _row(before: dict[str, Any], after: dict[str, Any], k: int) -> dict[str, Any]:
    """CPU-s per 1k stages of one pair, keyed ``before_c<n>``, ``remote_c<n>``, ``inline_c<n>``."""
    row: dict[str, Any] = {"pair": k}
    for side, d in (("before", before), ("after", after)):
        for r in d["throughput"]:
            mode = side if side == "before" else r["inference"]
            row[f"{mode}_c{r['phase']['concurrency']}"] = r["cpu_s_per_1k_stages_total"]
    return row


def summarise() -> dict[str, Any]:
    pairs = []
    for before in sorted(RAW.glob("ab_before_*.json")):
        after = RAW / before.name.replace("before", "after")
        k = int(before.stem.rsplit("_", 1)[1])
        pairs.append(_row(json.loads(before.read_text()), json.loads(after.read_text()), k))
    summary = {}
    for c in CONCURRENCIES:
        for mode in ("remote", "inline"):
            ratios = [p[f"{mode}_c{c}"] / p[f"before_c{c}"] for p in pairs]
            summary[f"{mode}_c{c}"] = {
                "median": st.median(ratios),
                "min": min(ratios),
                "max": max(ratios),
                "ratios": ratios,
            }
    return {"command": COMMAND, "pairs": pairs, "ratio_after_over_before": summary, "target": "<= 0.5"}


def markdown(res: dict[str, Any]) -> str:
    before_1 = [p["before_c1"] for p in res["pairs"]]
    lines = [
        "# CPU per stage: the code before issue 12 against today's, alternated in one session",
        "",
        "Simulated engines (a measuring instrument), gRPC door, one-stage requests back to back, 10 s per concurrency, the client in its own process and not counted. CPU-seconds per 1,000 stages over all of Chimera's processes (dispatcher, workers, Redis, router and predictor when remote). The code before is `f742f5a` (the commit that measured `load_before`), run from a git worktree with today's benchmark files, SDK and generated protos copied in (the wire format is compatible); today's code runs with the router and predictor as services (`remote`) and inside the dispatcher (`inline`). Each pair: before, then after, back to back. The host is shared and noisy "
        f"(the before-runs alone ranged {min(before_1):.1f}-{max(before_1):.1f} CPU-s per 1k stages at 1 in flight), so the ratio within a pair is the figure to read.",
        "",
        f"Command: {res['command']}",
        "",
        "| pair | " + " | ".join(f"before c={c} | remote c={c} | inline c={c}" for c in CONCURRENCIES) + " |",
        "|---|" + "---|---|---|" * len(CONCURRENCIES),
    ]
    for p in res["pairs"]:
        cells = (
            f"{p[f'before_c{c}']:.2f} | {p[f'remote_c{c}']:.2f} | {p[f'inline_c{c}']:.2f}"
            for c in CONCURRENCIES
        )
        lines.append(f"| {p['pair']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## After / before, per pair (target: at most 0.5)",
        "",
        "| in flight | remote median | spread | inline median | spread |",
        "|---|---|---|---|---|",
    ]
    for c in CONCURRENCIES:
        r, i = (res["ratio_after_over_before"][f"{m}_c{c}"] for m in ("remote", "inline"))
        lines.append(
            f"| {c} | {r['median']:.2f} | {r['min']:.2f}-{r['max']:.2f} | {i['median']:.2f} | {i['min']:.2f}-{i['max']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    _collect(Path(argv[0]) / "bench" / "results" if argv else None)
    res = summarise()
    (OUT / "load_stage_ab.json").write_text(json.dumps(res, indent=1) + "\n")
    (OUT / "load_stage_ab.md").write_text(markdown(res))
    sys.stdout.write(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
