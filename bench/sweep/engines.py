"""Engine profiles at paper scale, *derived* from stated facts (never tuned to favour a policy).

NOTE(derivation): one model per RTX A6000, vLLM with bf16 weights and KV cache. Every number below is either
a published fact [P] (model config, GPU datasheet), a vLLM default [V], or an assumption [A] stated with its
reason. The results README prints the table this module produces (``python -m bench.sweep.engines``).

Facts
- GPU [P, NVIDIA RTX A6000 datasheet]: 48 GB GDDR6, 768 GB/s memory bandwidth, 154.8 TFLOPS dense bf16
  tensor (309.7 with sparsity).
- Models [P, each model's Hugging Face config.json]: layers, KV heads, head dim, parameter count.
  Ministral-3-8B-Instruct-2512 [A]: its config was not reachable here; Ministral-8B-Instruct-2410's (36
  layers, 8 KV heads, head dim 128, 8.0B) stands in, and its ~0.4B vision tower is left out (text only).
- vLLM [V]: ``gpu_memory_utilization`` 0.90, ``max_num_seqs`` 256.

Derivation
- KV bytes per token = 2 (K and V) * layers * kv_heads * head_dim * 2 bytes.
- KV budget = 0.90 * 48 GB - weights (2 bytes per parameter) - ACTIVATION_RESERVE_GB.
- Decode step at batch b (roofline): a step reads every weight once and each sequence's KV once, and does
  2 * params FLOPs per sequence; it takes max(memory time, compute time) + STEP_OVERHEAD_MS, with memory time
  = (weights + b * ctx * kv_bytes) / (768 GB/s * MEM_EFFICIENCY) and compute time = 2 * params * b /
  (154.8 TFLOPS * COMPUTE_EFFICIENCY). ``ctx`` is the mean KV length of a decoding sequence in the workload
  (its prompt plus half its output), measured on generated traces.
- Prefill ms per token = 2 * params / (154.8 TFLOPS * COMPUTE_EFFICIENCY) (compute bound; the quadratic
  attention term is small at these prompt lengths and is left out).
- KV capacity in tokens = KV budget / KV bytes per token. The simulated engine admits a sequence only while
  its prompt fits in the free KV, runs at most 256 sequences, and when the cache fills while decoding it
  preempts the lowest-priority running sequence, which later re-prefills its prompt and what it had
  generated (vLLM's recompute preemption).
- ``max_batch_size`` (what the paper's L[m] divides by) is what ``chimera profile`` would report: the
  product's ``effective_max_batch`` on the curve, capped by the sequences that fit in KV at the workload's
  mean footprint (prompt plus output of one stage).
- ``decode_ms_per_token`` (what the paper's L[m] uses) = the single-stream step, step(1).

Assumptions [A]
- MEM_EFFICIENCY 0.75: decode kernels reach 70-80% of peak DRAM bandwidth on Ampere.
- COMPUTE_EFFICIENCY 0.5: large GEMMs reach about half the dense tensor peak.
- STEP_OVERHEAD_MS 3.0: scheduler, sampling and launch time of one vLLM step with CUDA graphs.
- ACTIVATION_RESERVE_GB 2.0: activations, CUDA graphs and the sampler's buffers.

Cross-check: no published A6000 throughput for these exact models could be checked offline, so the roofline
is the only source; the resulting single-stream speeds (about 120 tokens/s for 1.5B down to 18 tokens/s for
14B) sit in the range commonly reported for bf16 vLLM on 48 GB Ampere cards. Nothing was adjusted to match.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from services.common.types import EngineProfile
from services.worker.profiling import effective_max_batch

GPU_MEMORY_GB = 48.0
GPU_BANDWIDTH_GBS = 768.0
GPU_BF16_TFLOPS = 154.8
GPU_MEMORY_UTILIZATION = 0.90
VLLM_MAX_NUM_SEQS = 256
MEM_EFFICIENCY = 0.75
COMPUTE_EFFICIENCY = 0.5
STEP_OVERHEAD_MS = 3.0
ACTIVATION_RESERVE_GB = 2.0
BYTES_PER_PARAM = 2
# Batch sizes at which the step-time curve is tabulated (EngineProfile interpolates between them).
CURVE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 192, 256)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    key: str  # services.workload.models key
    params_b: float
    layers: int
    kv_heads: int
    head_dim: int

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * BYTES_PER_PARAM


# [P] config.json of each model (Ministral: see the module docstring).
CONFIGS: tuple[ModelConfig, ...] = (
    ModelConfig("qwen2.5-1.5b", 1.54, 28, 2, 128),
    ModelConfig("qwen2.5-3b", 3.09, 36, 2, 128),
    ModelConfig("qwen2.5-7b", 7.62, 28, 4, 128),
    ModelConfig("qwen2.5-14b", 14.77, 48, 8, 128),
    ModelConfig("llama-3.2-3b", 3.21, 28, 8, 128),
    ModelConfig("ministral-8b", 8.02, 36, 8, 128),
)


@dataclass(frozen=True, slots=True)
class WorkloadShape:
    """Per-stage token means of one model on the workload (measured on generated traces)."""

    prompt_tokens: float
    output_tokens: float


@dataclass(frozen=True, slots=True)
class Derived:
    config: ModelConfig
    shape: WorkloadShape
    kv_budget_gb: float
    kv_capacity_tokens: int
    fit_seqs: int  # sequences of the mean footprint that fit in KV
    profile: EngineProfile

    @property
    def max_num_seqs(self) -> int:
        return VLLM_MAX_NUM_SEQS


def config_for(key: str) -> ModelConfig:
    for c in CONFIGS:
        if c.key == key:
            return c
    raise KeyError(f"no engine config for {key!r}")


def step_ms(cfg: ModelConfig, batch: int, ctx_tokens: float) -> float:
    """Decode step time at ``batch`` sequences of mean KV length ``ctx_tokens`` (roofline + overhead)."""
    mem_s = (cfg.weight_bytes + batch * ctx_tokens * cfg.kv_bytes_per_token) / (
        GPU_BANDWIDTH_GBS * 1e9 * MEM_EFFICIENCY
    )
    cmp_s = 2 * cfg.params_b * 1e9 * batch / (GPU_BF16_TFLOPS * 1e12 * COMPUTE_EFFICIENCY)
    return max(mem_s, cmp_s) * 1e3 + STEP_OVERHEAD_MS


def derive(cfg: ModelConfig, shape: WorkloadShape) -> Derived:
    budget_gb = GPU_MEMORY_GB * GPU_MEMORY_UTILIZATION - cfg.weight_bytes / 1e9 - ACTIVATION_RESERVE_GB
    capacity = int(budget_gb * 1e9 / cfg.kv_bytes_per_token)
    footprint = shape.prompt_tokens + shape.output_tokens
    fit = max(1, min(VLLM_MAX_NUM_SEQS, int(capacity / footprint)))
    ctx = shape.prompt_tokens + shape.output_tokens / 2
    curve = tuple((b, round(step_ms(cfg, b, ctx), 3)) for b in CURVE_BATCHES)
    prefill = 2 * cfg.params_b * 1e9 / (GPU_BF16_TFLOPS * 1e12 * COMPUTE_EFFICIENCY) * 1e3
    profile = EngineProfile(
        decode_ms_per_token=curve[0][1],
        max_batch_size=effective_max_batch(curve, fit),
        prefill_ms_per_token=round(prefill, 5),
        step_ms=curve,
    )
    return Derived(cfg, shape, round(budget_gb, 2), capacity, fit, profile)


def measure_shapes(keys: Sequence[str], n: int = 400, seed: int = 7) -> dict[str, WorkloadShape]:
    """Mean stage prompt and output tokens per model over both datasets (uniform workflow mix), from
    generated traces of a seed no benchmark run uses."""
    from services.workload.corpus import load_corpus
    from services.workload.generate import bindings_for, generate
    from services.workload.outcome import OutcomeModel

    corpus = load_corpus()
    om = OutcomeModel(corpus.problems, models=list(keys))
    sums: dict[str, list[float]] = {k: [0.0, 0.0, 0.0] for k in keys}
    for prog in generate(corpus.problems, om, bindings_for(keys), n, seed):
        acc = sums[prog.outcome.engine]
        for t in prog.traces:
            acc[0] += t.prompt_tokens
            acc[1] += t.completion_tokens
            acc[2] += 1
    return {k: WorkloadShape(round(p / c, 1), round(o / c, 1)) for k, (p, o, c) in sums.items()}


def derive_all(shapes: dict[str, WorkloadShape]) -> dict[str, Derived]:
    return {k: derive(config_for(k), s) for k, s in shapes.items()}


def table(derived: dict[str, Derived]) -> str:
    """Markdown table of the derivation, for the results README."""
    head = (
        "| model | params (B) | KV B/token | KV budget (GB) | KV tokens | stage prompt / output | fit seqs "
        "| max_batch_size | step(1) ms | step(max) ms | tokens/s at max | prefill ms/token |\n|" + "---|" * 12
    )
    rows = []
    for k, d in derived.items():
        p = d.profile
        top = (p.max_batch_size, p.step_time_ms(p.max_batch_size))
        rows.append(
            f"| {k} | {d.config.params_b} | {d.config.kv_bytes_per_token:,} | {d.kv_budget_gb} | "
            f"{d.kv_capacity_tokens:,} | {d.shape.prompt_tokens:.0f} / {d.shape.output_tokens:.0f} | "
            f"{d.fit_seqs} | {p.max_batch_size} | {p.step_ms[0][1]:.1f} | {top[1]:.1f} | "
            f"{1000 * top[0] / top[1]:,.0f} | "
            f"{p.prefill_ms_per_token:.3f} |"
        )
    return "\n".join([head, *rows])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print the derived engine profiles as a markdown table.")
    parser.parse_args(argv)
    derived = derive_all(measure_shapes([c.key for c in CONFIGS]))
    sys.stdout.write(table(derived) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
