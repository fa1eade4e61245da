"""The load benchmark's result files: ``<stem>.json`` as measured and ``<stem>.md`` for people."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _door(row: dict[str, Any]) -> str:
    # Rows measured with the dispatcher's inline inference say so; remote (the default) stays unmarked.
    mode = row.get("inference", "remote")
    return row["phase"]["door"] + ("" if mode == "remote" else f" ({mode})")


def _throughput_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| door | in flight | stages/s | dispatch ms p50 | p99 | e2e s p50 | p99 | errors "
        "| CPU-s per 1k stages (all) | dispatcher | worker-fast | worker-slow | redis | router | predictor "
        "| client cores |",
        "|" + "---|" * 16,
    ]
    for r in rows:
        cpu = r["cpu_s_per_1k_stages"]
        lines.append(
            f"| {_door(r)} | {r['phase']['concurrency']} | {r['stages_per_s']:.1f} | "
            f"{r['dispatch_ms_p50']:.1f} | {r['dispatch_ms_p99']:.1f} | {r['e2e_s_p50']:.3f} | "
            f"{r['e2e_s_p99']:.3f} | {r['requests'] - r['ok']} | {r['cpu_s_per_1k_stages_total']:.2f} | "
            + " | ".join(
                f"{cpu.get(k, 0.0):.2f}"
                for k in ("dispatcher", "worker-fast", "worker-slow", "redis", "router", "predictor")
            )
            + f" | {r.get('client_cores', 0.0):.2f} |"
        )
    return lines


def _streams_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| door | streams | most open at once | completed | by status |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['phase']['door']} | {r['phase']['streams']} | {r['open_max']} | {r['ok']} | "
            f"{r['by_status']} |"
        )
    return lines


def _overload_table(o: dict[str, Any]) -> list[str]:
    lines = [
        f"Capacity (closed loop, 64 in flight): {o['capacity_stages_per_s']:.1f} stages/s; offered "
        f"{o['rate']:.1f} requests/s (Poisson); queue bound {o.get('bound_s', 0):g} s of predicted work per "
        "engine. Queue wait p99 is over the admitted requests.",
        "",
        "| door | requests | completed | browned out | refused | refused with Retry-After | other errors "
        "| queue wait p99 s | by status |",
        "|" + "---|" * 9,
    ]
    for door in ("grpc", "http"):
        if door not in o:
            continue
        r = o[door]
        lines.append(
            f"| {door} | {r['requests']} | {r['ok']} | {r['browned_out']} | {r['refused']} | "
            f"{r['refused_with_retry_after']} | {r['errors_other']} | {r['queue_wait_s_p99']:.2f} | "
            f"{r['by_status']} |"
        )
    return lines


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# Load benchmark: {result['config']['name']}",
        "",
        "Simulated engines (a measuring instrument: they stand in for GPUs so that only Chimera's processes "
        "are measured); the client runs in its own process and is not counted. "
        f"Command: `{result.get('command', '')}` ({result.get('runtime_s', 0)} s).",
        "",
    ]
    if "throughput" in result:
        lines += ["## Throughput: one-stage requests back to back", ""]
        lines += _throughput_table(result["throughput"])
    if "streams" in result:
        cfg = result["config"]
        lines += [
            "",
            "## Open streams held at once",
            "",
            f"Queue bound {cfg['stream_bound_s']:g} s per engine (above what the streams hold), "
            f"opened over {cfg['stream_ramp_s']:g} s, {cfg['stream_tokens']} tokens "
            "each, one token every 8 s.",
            "",
            *_streams_table(result["streams"]),
        ]
    if "overload" in result:
        lines += [
            "",
            "## Overload at ten times the measured capacity",
            "",
            *_overload_table(result["overload"]),
        ]
    return "\n".join(lines) + "\n"


def write_results(result: dict[str, Any], stem: Path) -> None:
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(result))
