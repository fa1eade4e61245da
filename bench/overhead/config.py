"""The overhead benchmark's parameters, apart from its code so that its helper modules can take them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.common.paths import RESULTS


@dataclass(frozen=True, slots=True)
class OverheadConfig:
    model: str = "smollm2"  # tiny | small | smollm2 | gemma3-270m | a model directory
    concurrency: int = 16
    requests: int = 64  # per phase
    max_tokens: int = 64
    repeats: int = 2  # of each path, alternated
    seed: int = 0
    max_model_len: int = 2048
    server_threads: int = 1  # OpenMP threads of the vLLM server (the rest of the CPUs serve Chimera)
    vllm_worker: bool = False  # also run Chimera with an in-process vllm worker (a different layout)
    enforce_eager: bool = True  # CPU needs it; on a GPU, False measures with CUDA graphs
    server_args: tuple[str, ...] = ()  # more api_server flags, e.g. ("--gpu-memory-utilization", "0.3")
    # Worker settings for Chimera's side, e.g. (("stream_tokens", "8"), ("publish_interval_s", "0.25")).
    worker_env: tuple[tuple[str, str], ...] = ()
    out_dir: Path = RESULTS
    state_dir: Path = Path(".chimera/bench")  # git-ignored
    name: str = "overhead"  # result file stem
