"""Chimera's CPU at the rates a GPU engine runs: cores per GPU, per process, streamed and not.

``python -m bench.overhead.gpu_rates`` (``make bench-gpu-rates``) serves one SIMULATED engine (a measuring
instrument) whose decode step is an H100's for an 8B model (``H100_8B`` below, derived from the card's memory
bandwidth and the model's size), with 256 sequences open at once, and drives it through the gRPC door from a
client in its own process (``bench.overhead.gpu_rates_client``), stage lengths drawn from the real traces.
Phases:

- ``stream``: every stage streamed (the engine sends text every ``stream_tokens`` tokens, the worker
  flushes every ``publish_interval_s``: the worker's defaults);
- ``whole``: every stage read whole (the SDK's ``generate()``: no per-token relay);
- ``mix``: half and half;
- ``per_stage``: one-token stages read whole, at the phases' own stage rate and at the reference rate: the
  work each stage costs whatever its length (it depends on the rate: concurrent calls coalesce);
- ``mix_inline`` and its per-stage phases: the same on a stack whose dispatcher runs the router and
  predictor models itself (``LauncherSettings.inference``), with no gRPC call to either.

Each process's CPU is read with psutil over each phase. The simulated engine runs inside the worker process,
so its own CPU (measured alone, ``engine_alone``, same lengths and batch, no Chimera around it) is taken out
of the worker's figure. The relay cost per 1,000 tokens is a phase's CPU less its stages' per-stage cost;
cores per GPU are given at the reference point (10,000 output tokens/s and 60 stages/s per engine) from the
two measured coefficients.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common.paths import DATA, RESULTS
from bench.common.procs import cpu_seconds, stack_groups
from bench.overhead.gpu_rates_report import markdown
from services.common.types import ChatMessage, EngineProfile, SamplingParams, StageRequest
from services.launcher.config import LauncherSettings
from services.launcher.pool import EngineSpec, PoolSpec
from services.launcher.stack import running_stack

log = logging.getLogger("bench.overhead.gpu_rates")
TRACES = DATA / "real"

# An H100 SXM decoding an 8B model (Llama-3-8B shape: 32 layers, 8 KV heads of 128, bf16). A decode step
# reads the weights once (16 GB) and each sequence's KV cache (128 KiB a token; 1,500 tokens of context:
# 192 MB a sequence). At 3.35 TB/s and about 70% of it achieved: 7.0 ms for the weights and 0.082 ms per
# sequence. So 256 sequences take 28 ms a step: 9,100 tokens/s, in the 5,000-15,000 the issue names.
# Prefill is compute-bound: 16 GFLOP a token at about 500 TFLOP/s achieved, 0.032 ms a prompt token.
H100_8B = EngineProfile(
    decode_ms_per_token=7.0,
    max_batch_size=256,
    prefill_ms_per_token=0.032,
    step_ms=tuple((b, round(7.0 + 0.082 * b, 3)) for b in (1, 8, 32, 64, 128, 192, 256)),
)
REFERENCE_TOKENS_PER_S = 10_000.0
REFERENCE_STAGES_PER_S = 60.0


@dataclass(frozen=True, slots=True)
class Config:
    name: str = "gpu_rates"
    streams: int = 256
    duration_s: float = 40.0
    warmup_s: float = 8.0
    seed: int = 0


def real_lengths() -> tuple[int, ...]:
    """Output tokens of every stage in the committed real traces."""
    out = []
    for path in sorted(TRACES.glob("traces-*.jsonl")):
        out += [int(json.loads(line)["completion_tokens"]) for line in path.open() if line.strip()]
    return tuple(x for x in out if x > 0)


def _pool(seqs: int) -> PoolSpec:
    env = {
        "time_scale": "1",
        "profile_json": H100_8B.to_json(),
        # Every request produces exactly its max_tokens: the lengths come from the client's draw.
        "sim_length_median": "1e9",
        "sim_length_sigma": "0",
    }
    spec = EngineSpec(
        id="gpu", model="sim-8b", kind="simulated", max_num_seqs=seqs, stand_in="ministral-8b", env=env
    )
    return PoolSpec(engines=(spec,))


def _client(phase: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.overhead.gpu_rates_client"],
        input=json.dumps(phase),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"client failed: {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def measured_phase(
    groups: Mapping[str, tuple[int, bool]], phase: dict[str, Any], label: str
) -> dict[str, Any]:
    before = cpu_seconds(groups)
    result = _client(phase)
    after = cpu_seconds(groups)
    result["cpu_s"] = {k: round(after[k] - before.get(k, 0.0), 3) for k in after}
    log.info(
        "%s: %.0f tokens/s, %.1f stages/s, gap p50 %.0f ms, ttft p50 %.0f ms, cpu %s, errors %s",
        label,
        result["tokens_per_s"],
        result["stages_per_s"],
        result["chunk_gap_ms_p50"],
        result["ttft_ms_p50"],
        result["cpu_s"],
        result["errors"],
    )
    return result


@contextlib.contextmanager
def stack_of(cfg: Config, state: Path, inference: str = "remote") -> Iterator[Callable[..., dict[str, Any]]]:
    """A warmed-up stack (the router and predictor in their services, or ``inline`` in the dispatcher), as
    a function that measures one phase on it."""
    settings = LauncherSettings.ephemeral(state / inference, start_timeout_s=300, inference=inference)
    with running_stack(settings, _pool(cfg.streams)) as stack:
        groups = stack_groups(stack)
        base = {"addr": stack.dispatcher_addr, "concurrency": cfg.streams, "seed": cfg.seed}
        _client({**base, "lengths": [64], "duration_s": cfg.warmup_s})

        def measure(label: str, **phase: Any) -> dict[str, Any]:
            res = measured_phase(groups, {**base, "duration_s": cfg.duration_s, **phase}, label)
            return {"label": label, "inference": inference, **res}

        yield measure


async def _engine_alone(
    lengths: Sequence[int], streams: int, duration_s: float, stream_tokens: int
) -> dict[str, Any]:
    """The simulated engine with nothing around it: its consumers only count what it yields."""
    from services.worker.engine.simulated import SimulatedEngine

    class Exact:
        def __call__(self, request: StageRequest) -> int:
            return request.sampling.max_tokens

    eng = SimulatedEngine("sim-8b", H100_8B, streams, 1.0, lengths=Exact(), stream_tokens=stream_tokens)
    await eng.start()
    rng, tokens, n = random.Random(0), 0, 0
    stop = time.perf_counter() + duration_s

    async def caller(i: int) -> None:
        nonlocal tokens, n
        while time.perf_counter() < stop:
            n += 1
            req = StageRequest(
                f"r{i}-{n}", f"p{i}-{n}", 0, "code/coder", (ChatMessage("user", "Write a function."),),
                SamplingParams(max_tokens=rng.choice(lengths)),
            )  # fmt: skip
            async for out in eng.generate(req, req.request_id, 0):
                if out.finished:
                    tokens += out.completion_tokens

    ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(streams)))
    ru1, elapsed = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
    await eng.stop()
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {
        "stream_tokens": stream_tokens,
        "tokens": tokens,
        "elapsed_s": round(elapsed, 3),
        "cpu_s": round(cpu, 3),
    }


def engine_alone(lengths: Sequence[int], cfg: Config, stream_tokens: int) -> dict[str, Any]:
    args = json.dumps({"lengths": list(lengths), "streams": cfg.streams, "duration_s": cfg.duration_s / 2,
                       "stream_tokens": stream_tokens})  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "bench.overhead.gpu_rates", "--engine-alone", args],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"engine alone failed: {proc.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["cpu_s_per_1k_tokens"] = round(out["cpu_s"] * 1000 / max(1, out["tokens"]), 4)
    log.info("engine alone, text every %d tokens: %s", stream_tokens, out)
    return out


def run(cfg: Config) -> dict[str, Any]:
    from services.worker.config import WorkerSettings

    lengths = real_lengths()
    default_tokens = WorkerSettings.model_fields["stream_tokens"].default
    default_interval = WorkerSettings.model_fields["publish_interval_s"].default
    result: dict[str, Any] = {
        "config": asdict(cfg),
        "profile": json.loads(H100_8B.to_json()),
        "lengths": {"n": len(lengths), "mean": round(sum(lengths) / len(lengths), 1)},
        "cadence": {"stream_tokens": default_tokens, "publish_interval_s": default_interval},
        "reference": {"tokens_per_s": REFERENCE_TOKENS_PER_S, "stages_per_s": REFERENCE_STAGES_PER_S},
    }
    with tempfile.TemporaryDirectory(prefix="chimera-gpu-rates-") as tmp:
        state = Path(tmp)
        with stack_of(cfg, state) as measure:
            phases = [
                measure("stream", lengths=lengths, stream_share=1.0),
                whole := measure("whole", lengths=lengths, stream_share=0.0),
                measure("mix", lengths=lengths, stream_share=0.5),
                # Per-stage work depends on the stage rate (calls coalesce): measured at the rate the
                # phases above ran at, to take out of theirs, and at the reference rate, to price it there.
                measure("per_stage", lengths=[1], stream_share=0.0, rate=whole["stages_per_s"]),
                measure("per_stage_reference", lengths=[1], stream_share=0.0, rate=REFERENCE_STAGES_PER_S),
            ]
        # The router and predictor inside the dispatcher (LauncherSettings.inference): no gRPC call to
        # either per first stage, their models' work in the dispatcher's process instead.
        with stack_of(cfg, state, "inline") as measure:
            phases += [
                mix := measure("mix_inline", lengths=lengths, stream_share=0.5),
                measure("per_stage_inline_own", lengths=[1], stream_share=0.0, rate=mix["stages_per_s"]),
                measure("per_stage_inline", lengths=[1], stream_share=0.0, rate=REFERENCE_STAGES_PER_S),
            ]
    result["phases"] = phases
    result["engine_alone"] = engine_alone(lengths, cfg, default_tokens)
    result["summary"] = summarize(result)
    return result


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Per phase and process: relay CPU-s per 1,000 tokens (its CPU less its stages' per-stage cost, the
    simulated engine's own CPU taken out of the worker's) and cores per GPU at the reference point."""
    phases = {p["label"]: p for p in result["phases"]}

    def per_stage_of(label: str) -> dict[str, float]:
        p = phases[label]
        return {k: v / max(1, p["stages"]) for k, v in p["cpu_s"].items()}

    per_stage, at_ref = per_stage_of("per_stage"), per_stage_of("per_stage_reference")
    inline_own, inline_ref = per_stage_of("per_stage_inline_own"), per_stage_of("per_stage_inline")
    ref_t, ref_s = result["reference"]["tokens_per_s"], result["reference"]["stages_per_s"]
    out: dict[str, Any] = {
        "per_stage_cpu_ms": {k: round(1000 * v, 3) for k, v in per_stage.items()},
        "per_stage_cpu_ms_at_reference": {k: round(1000 * v, 3) for k, v in at_ref.items()},
        "cores_per_100_stages_per_s": round(100 * sum(at_ref.values()), 3),
        "per_stage_cpu_ms_inline": {k: round(1000 * v, 3) for k, v in inline_ref.items()},
        "cores_per_100_stages_per_s_inline": round(100 * sum(inline_ref.values()), 3),
    }
    for label, p in phases.items():
        if label.startswith("per_stage"):
            continue
        engine_1k = result["engine_alone"]["cpu_s_per_1k_tokens"]
        own, ref = (inline_own, inline_ref) if p["inference"] == "inline" else (per_stage, at_ref)
        relay = {}
        for proc, cpu in p["cpu_s"].items():
            cpu -= own.get(proc, 0.0) * p["stages"]
            if proc.startswith("worker"):
                cpu -= engine_1k * p["tokens"] / 1000
            relay[proc] = max(0.0, cpu) * 1000 / max(1, p["tokens"])
        cores = {k: relay[k] * ref_t / 1000 + ref.get(k, 0.0) * ref_s for k in relay}
        out[label] = {
            "tokens_per_s": p["tokens_per_s"],
            "stages_per_s": p["stages_per_s"],
            "relay_cpu_s_per_1k_tokens": round(sum(relay.values()), 4),
            "relay_cpu_s_per_1k_tokens_by_process": {k: round(v, 4) for k, v in relay.items()},
            "cores_per_gpu": round(sum(cores.values()), 3),
            "cores_per_gpu_by_process": {k: round(v, 3) for k, v in cores.items()},
            "chunk_gap_ms_p50": p["chunk_gap_ms_p50"],
            "chunk_gap_ms_p90": p["chunk_gap_ms_p90"],
            "ttft_ms_p50": p["ttft_ms_p50"],
            "ttft_ms_p99": p["ttft_ms_p99"],
            "errors": p["errors"],
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    d = Config()
    ap = argparse.ArgumentParser(
        prog="python -m bench.overhead.gpu_rates", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--name", default=d.name, help="result file stem in bench/results/")
    ap.add_argument("--duration", type=float, default=d.duration_s, help="seconds per phase")
    ap.add_argument("--streams", type=int, default=d.streams, help="sequences open at once on the engine")
    ap.add_argument("--engine-alone", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.engine_alone:
        a = json.loads(args.engine_alone)
        res = asyncio.run(_engine_alone(a["lengths"], a["streams"], a["duration_s"], a["stream_tokens"]))
        print(json.dumps(res))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg = Config(name=args.name, duration_s=args.duration, streams=args.streams)
    started = time.perf_counter()
    result = run(cfg)
    result["runtime_s"] = round(time.perf_counter() - started, 1)
    result["command"] = "python -m bench.overhead.gpu_rates " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    stem = RESULTS / cfg.name
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
