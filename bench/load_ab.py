"""Per-stage CPU, before issue 12 against today, from alternated ``bench.load`` runs (one-off summary).

Reads ``ab_before_K.json`` (run in a worktree of f742f5a, see the command below) and ``ab_after_K.json``
(run here), copies both into ``bench/results/load_stage_ab/`` and writes ``load_stage_ab.{json,md}``: each
pair's ratio after/before, because the shared host's speed drifts between pairs more than within one.

Usage: ``python -m bench.load_ab <worktree of f742f5a>``
"""

# ruff: noqa: E501  (the report's sentences are kept whole)
import json
import shutil
import statistics as st
import sys
from pathlib import Path

out = Path("bench/results")
raw = out / "load_stage_ab"
raw.mkdir(exist_ok=True)
before_dir = Path(sys.argv[1]) / "bench" / "results"
pairs = []
for k in range(1, 10):
    b = before_dir / f"ab_before_{k}.json"
    a = out / f"ab_after_{k}.json"
    if not b.exists() and (raw / b.name).exists():
        b, a = raw / b.name, raw / a.name  # a rerun of the summary from the committed raw files
    if not (b.exists() and a.exists()):
        continue
    if b.parent != raw:
        shutil.copy(b, raw / b.name)
        shutil.copy(a, raw / a.name)
    bd, ad = json.loads(b.read_text()), json.loads(a.read_text())
    row = {"pair": k}
    for r in bd["throughput"]:
        row[f"before_c{r['phase']['concurrency']}"] = r["cpu_s_per_1k_stages_total"]
    for r in ad["throughput"]:
        row[f"{r['inference']}_c{r['phase']['concurrency']}"] = r["cpu_s_per_1k_stages_total"]
    pairs.append(row)
summary = {}
for c in (1, 16, 64):
    for mode in ("remote", "inline"):
        ratios = [p[f"{mode}_c{c}"] / p[f"before_c{c}"] for p in pairs]
        summary[f"{mode}_c{c}"] = {
            "median": st.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
            "ratios": ratios,
        }
res = {
    "command": "alternated: (cd <worktree of f742f5a with today's bench/load*.py, bench/overhead_procs.py, chimera_client and generated protos copied in> && python -m bench.load --name ab_before_K --phases throughput --no-overload --doors grpc --concurrencies 1 16 64); python -m bench.load --name ab_after_K --phases throughput --no-overload --doors grpc --concurrencies 1 16 64 --inference remote inline",
    "pairs": pairs,
    "ratio_after_over_before": summary,
    "target": "<= 0.5",
}
(out / "load_stage_ab.json").write_text(json.dumps(res, indent=1) + "\n")
lines = [
    "# CPU per stage: the code before issue 12 against today's, alternated in one session",
    "",
    "Simulated engines (a measuring instrument), gRPC door, one-stage requests back to back, 10 s per concurrency, the client in its own process and not counted. CPU-seconds per 1,000 stages over all of Chimera's processes (dispatcher, workers, Redis, router and predictor when remote). The code before is `f742f5a` (the commit that measured `load_before`), run from a git worktree with today's benchmark files, SDK and generated protos copied in (the wire format is compatible); today's code runs with the router and predictor as services (`remote`) and inside the dispatcher (`inline`). Each pair: before, then after, back to back. The host is shared and noisy (a pair's two runs can differ by 2x in speed), so the ratio within a pair is the figure to read.",
    "",
    f"Command: {res['command']}",
    "",
    "| pair | " + " | ".join(f"before c={c} | remote c={c} | inline c={c}" for c in (1, 16, 64)) + " |",
    "|---|" + "---|---|---|" * 3,
]
for p in pairs:
    lines.append(
        f"| {p['pair']} | "
        + " | ".join(
            f"{p[f'before_c{c}']:.2f} | {p[f'remote_c{c}']:.2f} | {p[f'inline_c{c}']:.2f}"
            for c in (1, 16, 64)
        )
        + " |"
    )
lines += [
    "",
    "## After / before, per pair (target: at most 0.5)",
    "",
    "| in flight | remote median | spread | inline median | spread |",
    "|---|---|---|---|---|",
]
for c in (1, 16, 64):
    r, i = summary[f"remote_c{c}"], summary[f"inline_c{c}"]
    lines.append(
        f"| {c} | {r['median']:.2f} | {r['min']:.2f}-{r['max']:.2f} | {i['median']:.2f} | {i['min']:.2f}-{i['max']:.2f} |"
    )
lines.append("")
(out / "load_stage_ab.md").write_text("\n".join(lines))
print("\n".join(lines))
