"""How an in-process engine is set up for its machine: the dtype "auto" picks from the CPU's flags, and
the OpenMP binding each engine of a pool gets on the cores it may use."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.launcher.cores import thread_plan
from services.worker.engine.machine import choose_dtype, cpu_flags, cpu_summary

pytestmark = pytest.mark.unit

AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma"})
ZEN4 = AVX2 | {"avx512f", "avx512_bf16", "avx512_vnni"}
SAPPHIRE = AVX2 | {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}


def test_auto_runs_bf16_only_where_the_cpu_has_bf16_arithmetic() -> None:
    assert choose_dtype("auto", on_cpu=True, flags=AVX2) == "float32"
    assert choose_dtype("auto", on_cpu=True, flags=AVX2 | {"avx512f"}) == "float32"  # AVX-512 without BF16
    assert choose_dtype("auto", on_cpu=True, flags=ZEN4) == "bfloat16"
    assert choose_dtype("auto", on_cpu=True, flags=SAPPHIRE) == "bfloat16"
    assert choose_dtype("auto", on_cpu=False, flags=frozenset()) == "auto"  # a GPU: the checkpoint's dtype
    assert choose_dtype("bfloat16", on_cpu=True, flags=AVX2) == "bfloat16"  # named: used as given


def test_cpu_flags_and_summary(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse4_2 avx2 avx512f avx512_bf16\n\nprocessor\t: 1\n")
    flags = cpu_flags(info)
    assert {"avx2", "avx512_bf16"} <= flags
    assert cpu_summary(flags) == "avx2+avx512f+avx512_bf16"
    assert cpu_flags(tmp_path / "absent") == frozenset() and cpu_summary(frozenset()) == "none"


def test_each_engine_gets_its_own_cores_while_there_are_enough() -> None:
    assert thread_plan(["a", "b"], [0, 1]) == {
        "a": {"VLLM_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1"},
        "b": {"VLLM_CPU_OMP_THREADS_BIND": "1", "OMP_NUM_THREADS": "1"},
    }
    plan = thread_plan(["a", "b", "c"], [0, 1, 2, 3, 4, 5, 6])
    assert [p["VLLM_CPU_OMP_THREADS_BIND"] for p in plan.values()] == ["0-2", "3-4", "5-6"]
    assert thread_plan(["a"], [2, 3, 5]) == {
        "a": {"VLLM_CPU_OMP_THREADS_BIND": "2-3,5", "OMP_NUM_THREADS": "3"}
    }


def test_more_engines_than_cores_run_unbound_one_thread_each() -> None:
    plan = thread_plan(["a", "b", "c"], [0, 1])
    assert all(p == {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"} for p in plan.values())
    assert thread_plan([], [0, 1]) == {}
