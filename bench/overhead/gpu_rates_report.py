"""The GPU-rates benchmark's Markdown, from its JSON (``bench.overhead.gpu_rates``)."""

from __future__ import annotations

from typing import Any

_TARGETS = {"stream": 0.03, "whole": 0.01}


def markdown(r: dict[str, Any]) -> str:
    s, ref = r["summary"], r["reference"]
    procs = sorted(s["per_stage_cpu_ms"])
    lines = [
        f"# Chimera's CPU at GPU rates: {r['config']['name']}",
        "",
        "One SIMULATED engine (a measuring instrument) with an H100's decode step for an 8B model "
        f"(step_ms {r['profile']['step_ms']}, derived in `bench/overhead/gpu_rates.py`), "
        f"{r['config']['streams']} requests open at once, stage lengths drawn from the real traces "
        f"({r['lengths']['n']} stages, mean {r['lengths']['mean']} tokens). The engine sends text every "
        f"{r['cadence']['stream_tokens']} tokens; the worker flushes every "
        f"{r['cadence']['publish_interval_s']} s. "
        f"Command: `{r.get('command', '')}` ({r.get('runtime_s', 0)} s). The simulated engine's own CPU "
        "(measured alone) is taken out of the worker's; per-stage work (one-token stages read whole, at "
        f"{ref['stages_per_s']:g}/s) is taken out of the relay figure. Cores per GPU at "
        f"{ref['tokens_per_s']:g} tokens/s and {ref['stages_per_s']:g} stages/s.",
        "",
        "| phase | tokens/s | stages/s | relay CPU-s / 1k tokens | target | cores per GPU | "
        + " | ".join(f"{p} cores" for p in procs)
        + " | chunk gap p50 / p90 ms | TTFT p50 / p99 ms | errors |",
        "|---|---|---|---|---|---|" + "---|" * len(procs) + "---|---|---|",
    ]
    for label in ("stream", "whole", "mix", "mix_inline"):
        p = s[label]
        target = _TARGETS.get(label)
        by = p["cores_per_gpu_by_process"]
        lines.append(
            f"| {label} | {p['tokens_per_s']:.0f} | {p['stages_per_s']:.1f} | "
            f"{p['relay_cpu_s_per_1k_tokens']:.4f} | {'' if target is None else f'<= {target}'} | "
            f"{p['cores_per_gpu']:.3f} | "
            + " | ".join(f"{by.get(x, 0.0):.3f}" for x in procs)
            + f" | {p['chunk_gap_ms_p50']:.0f} / {p['chunk_gap_ms_p90']:.0f} | "
            f"{p['ttft_ms_p50']:.0f} / {p['ttft_ms_p99']:.0f} | {p['errors'] or 0} |"
        )
    lines += [
        "",
        f"Per-stage work: {s['cores_per_100_stages_per_s']:.3f} cores per 100 stages/s; CPU-ms per stage "
        + ", ".join(f"{k} {v:.2f}" for k, v in s["per_stage_cpu_ms_at_reference"].items())
        + f" at {ref['stages_per_s']:g} stages/s (at the phases' own rate: "
        + ", ".join(f"{k} {v:.2f}" for k, v in s["per_stage_cpu_ms"].items())
        + "). With the router and predictor inline in the dispatcher: "
        f"{s['cores_per_100_stages_per_s_inline']:.3f} cores per 100 stages/s ("
        + ", ".join(f"{k} {v:.2f}" for k, v in s["per_stage_cpu_ms_inline"].items())
        + ").",
        "",
        "Simulated engine alone (taken out of the worker's figures): "
        f"{r['engine_alone']['cpu_s_per_1k_tokens']:.4f} CPU-s per 1k tokens.",
        "",
    ]
    return "\n".join(lines)
