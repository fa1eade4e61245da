"""Seed spread of the sweep's single-seed claims: chimera-plus against the paper rule, and Figure 3's order.

Usage: ``python -m bench.sweep.seeds --seeds 20260323 20260333 20260343`` runs the full sweep
(``bench.sweep.run``) once per seed (each seed draws its own jobs and arrivals and trains its own router and
predictor on seed + 1) and writes ``results/seeds.json`` and ``results/seeds.md``: per cell, every seed's
value and the verdict on the mean over seeds. A one-seed difference below the spread between seeds is noise,
so the verdicts that the README states are the ones on the means.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.common.paths import CACHE, RESULTS
from bench.sweep.report import fig3_check, rule_hypervolumes
from bench.sweep.run import MODES, sweep

FIG3_VARIANTS = ("vllm", "ltr", "stjf-learned")  # FCFS, SJF, STJF


def improved_cells(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (dataset, pool, RPS): the hypervolume of each rule's frontier over tau, per seed, with a
    reference point shared by both rules within a seed."""
    cells = []
    first = runs[0]["frontier"]
    for d, pools in first.items():
        for pool, by_rps in pools.items():
            for rps in by_rps:
                paper, plus = [], []
                for r in runs:
                    ha, hb = rule_hypervolumes(r["frontier"][d][pool][rps])
                    paper.append(ha)
                    plus.append(hb)
                cells.append({"dataset": d, "pool": pool, "rps": rps, "hv_paper": paper, "hv_plus": plus})
    return cells


def fig3_cells(runs: Sequence[Mapping[str, Any]], section: str) -> list[dict[str, Any]]:
    """Per (dataset, model, load): mean queue time of FCFS, SJF and STJF, per seed."""
    cells = []
    for d, models in runs[0][section].items():
        for m, by_load in models.items():
            for load in by_load:
                q = {v: [r[section][d][m][load][v]["queue_mean_s"] for r in runs] for v in FIG3_VARIANTS}
                cells.append({"dataset": d, "model": m, "load": load, "queue_s": q})
    return cells


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def improved_md(cells: Sequence[Mapping[str, Any]]) -> tuple[str, int, int]:
    lines = [
        "| dataset | pool | RPS | plus / paper HV per seed | mean HV paper | mean HV plus | ratio of means |",
        "|" + "---|" * 7,
    ]
    ge = strictly = 0
    for c in cells:
        hp, hq = _mean(c["hv_paper"]), _mean(c["hv_plus"])
        ge += hq >= hp
        strictly += hq > hp * 1.01
        per = ", ".join(
            f"{b / a:.2f}" if a else "nan" for a, b in zip(c["hv_paper"], c["hv_plus"], strict=True)
        )
        lines.append(
            f"| {c['dataset']} | {c['pool']} | {c['rps']} | {per} | {hp:.2f} | {hq:.2f} | {hq / hp:.2f} |"
        )
    return "\n".join(lines), ge, strictly


def fig3_md(cells: Sequence[Mapping[str, Any]]) -> tuple[str, list[str]]:
    lines = [
        "| dataset | model | load | FCFS s (mean) | SJF s | STJF s | SJF vs FCFS | STJF vs SJF "
        "| order on means | seeds with the order |",
        "|" + "---|" * 10,
    ]
    failures = []
    for c in cells:
        q = c["queue_s"]
        f, s, t = (_mean(q[v]) for v in FIG3_VARIANTS)
        per = sum(tt < ss < ff for ff, ss, tt in zip(*(q[v] for v in FIG3_VARIANTS), strict=True))
        check = fig3_check(f, s, t)
        if check == "NO":
            failures.append(f"{c['dataset']} {c['model']} load {c['load']}")
        lines.append(
            f"| {c['dataset']} | {c['model']} | {c['load']} | {f:.2f} | {s:.2f} | {t:.2f} | "
            f"{100 * (s / f - 1) if f else 0:+.0f}% | {100 * (t / s - 1) if s else 0:+.0f}% | {check} | "
            f"{per} of {len(q['vllm'])} |"
        )
    return "\n".join(lines), failures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="The full sweep over several seeds: the spread of its claims."
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[20260323, 20260333, 20260343])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--cache", type=Path, default=CACHE)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    runs = [sweep(MODES["full"], seed, args.cache) for seed in args.seeds]
    imp = improved_cells(runs)
    f3 = {sec: fig3_cells(runs, sec) for sec in ("fig3", "fig3_noaging")}
    command = "python -m bench.sweep.seeds " + " ".join(argv if argv is not None else sys.argv[1:])
    data = {
        "command": command,
        "seeds": args.seeds,
        "runtime_s": round(time.perf_counter() - started, 1),
        "improved": imp,
        **f3,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "seeds.json").write_text(json.dumps(data, indent=1) + "\n")
    table, ge, strictly = improved_md(imp)
    f3a, fail_a = fig3_md(f3["fig3"])
    f3n, fail_n = fig3_md(f3["fig3_noaging"])
    (args.out / "seeds.md").write_text(
        f"# The sweep over {len(args.seeds)} seeds ({', '.join(map(str, args.seeds))})\n\n"
        f"Command: `{command}` ({data['runtime_s']} s).\n\n"
        "## chimera-plus vs the paper rule: hypervolume of the frontier over tau\n\n"
        f"On the means over seeds, chimera-plus is at least as good in {ge} of {len(imp)} cells and "
        f"better by more than 1% in {strictly}.\n\n{table}\n\n"
        "## Figure 3 with the dispatcher's aging: STJF < SJF < FCFS on the means\n\n"
        f"Cells where FCFS queues >= 1 s and the order fails: {', '.join(fail_a) or 'none'}.\n\n{f3a}\n\n"
        "## Figure 3 with aging all but off\n\n"
        f"Cells where FCFS queues >= 1 s and the order fails: {', '.join(fail_n) or 'none'}.\n\n{f3n}\n"
    )
    sys.stderr.write(f"wrote {args.out}/seeds.md in {data['runtime_s']} s\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
