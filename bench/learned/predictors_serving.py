"""Serving latency of the router and predictor services, for ``bench.learned.predictors``.

Each service runs as its real process (``python -m services.router`` / ``services.predictor``, configured by
the environment as the launcher does) on loopback, serving an artifact trained by the benchmark. One client
calls in a closed loop (the next call leaves when the previous answer arrived), after a warm-up, and the
wall time of every call is recorded: gRPC, the batch collector, the hop to the inference process and the
model itself. Batch 1 is one item per call, batch 32 is 32 items per call.

NOTE(window): the collector holds a batch open up to ``max_wait_ms`` for more callers. A lone caller gains
nothing from that wait, so the headline numbers use a window of 0; ``batch_1_default_window`` repeats
batch 1 with the service's default window to show what that setting costs an unloaded service.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chimera.predictor.v1 import predictor_pb2, predictor_pb2_grpc
from chimera.router.v1 import router_pb2, router_pb2_grpc
from services.common.types import TraceRow
from services.predictor.config import PredictorSettings
from services.predictor.server import SERVICE_NAME as PREDICTOR_SERVICE
from services.router.config import RouterSettings
from services.router.server import SERVICE_NAME as ROUTER_SERVICE

log = logging.getLogger(__name__)

START_TIMEOUT_S = 180.0
WARMUP_CALLS = 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def service(module: str, prefix: str, name: str, artifact_dir: Path, max_wait_ms: float) -> Iterator[str]:
    """Start ``python -m <module>`` serving ``artifact_dir``; yield its address once it reports SERVING."""
    port = _free_port()
    env = os.environ | {
        f"{prefix}HOST": "127.0.0.1",
        f"{prefix}PORT": str(port),
        f"{prefix}ARTIFACT_DIR": str(artifact_dir),
        f"{prefix}MAX_WAIT_MS": str(max_wait_ms),
        f"{prefix}METRICS_PORT": "0",  # never collide with a running stack's exporter
    }
    log_file = artifact_dir.parent / f"{artifact_dir.name}-{max_wait_ms:g}.log"
    with open(log_file, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", module], env=env, stdout=out, stderr=subprocess.STDOUT)
    addr = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        with grpc.insecure_channel(addr) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{module} exited with {proc.returncode}: see {log_file}")
                with contextlib.suppress(grpc.RpcError):
                    reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=1.0)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{module} not serving after {START_TIMEOUT_S:.0f} s")
                time.sleep(0.2)
        yield addr
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def timed(call: Callable[[], Any], calls: int) -> dict[str, float]:
    for _ in range(WARMUP_CALLS):
        call()
    ms = np.empty(calls, dtype=np.float64)
    for i in range(calls):
        t = time.perf_counter()
        call()
        ms[i] = (time.perf_counter() - t) * 1000
    return {
        "calls": float(calls),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": float(ms.mean()),
    }


def _router_calls(addr: str, rows: Sequence[TraceRow], batch: int) -> Callable[[], Any]:
    channel = grpc.insecure_channel(addr)
    stub = router_pb2_grpc.RouterStub(channel)
    items = [router_pb2.RouterInput(text=r.user_text, workflow=r.workflow) for r in rows]
    requests = [
        router_pb2.ScoreRequest(items=items[i : i + batch]) for i in range(0, len(items) - batch, batch)
    ]
    state = {"i": 0}

    def call() -> Any:
        state["i"] = (state["i"] + 1) % len(requests)
        return stub.Score(requests[state["i"]], timeout=30)

    return call


def _predictor_calls(addr: str, rows: Sequence[TraceRow], batch: int) -> Callable[[], Any]:
    channel = grpc.insecure_channel(addr)
    stub = predictor_pb2_grpc.PredictorStub(channel)
    feats = [
        predictor_pb2.FeatureRow(
            model=r.model,
            workflow=r.workflow,
            stage=r.stage,
            system_text=r.system_text,
            user_text=r.user_text,
            prompt_text=r.prompt_text,
        )
        for r in rows
    ]
    requests = [
        predictor_pb2.PredictRequest(rows=feats[i : i + batch], quantiles=[0.5, 0.9])
        for i in range(0, len(feats) - batch, batch)
    ]
    state = {"i": 0}

    def call() -> Any:
        state["i"] = (state["i"] + 1) % len(requests)
        return stub.Predict(requests[state["i"]], timeout=30)

    return call


def _measure(
    module: str, prefix: str, name: str, kind_dir: Path, default_wait: float, make: Any, rows: Any, calls: int
) -> dict[str, Any]:
    out: dict[str, Any] = {"max_wait_ms": 0.0, "default_max_wait_ms": default_wait}
    with service(module, prefix, name, kind_dir, 0.0) as addr:
        out["batch_1"] = timed(make(addr, rows, 1), calls)
        out["batch_32"] = timed(make(addr, rows, 32), max(20, calls // 3))
    with service(module, prefix, name, kind_dir, default_wait) as addr:
        out["batch_1_default_window"] = timed(make(addr, rows, 1), max(20, calls // 3))
    log.info("%s: %s", kind_dir.name, out)
    return out


def latency_section(
    root: Path, routers: Sequence[str], rows: Sequence[TraceRow], calls: int, seed: int
) -> Any:
    """Latency per service; ``root`` holds ``router-<name>/`` and ``predictor-qrf/`` artifact dirs."""
    order = np.random.default_rng(seed).permutation(len(rows))
    sample = [rows[i] for i in order[: max(64, 32 * 8)]]
    out: dict[str, Any] = {}
    for r in routers:
        out[f"router/{r}"] = _measure(
            "services.router",
            "CHIMERA_ROUTER_",
            ROUTER_SERVICE,
            root / f"router-{r}",
            RouterSettings().max_wait_ms,
            _router_calls,
            sample,
            calls,
        )
    out["predictor/qrf"] = _measure(
        "services.predictor",
        "CHIMERA_PREDICTOR_",
        PREDICTOR_SERVICE,
        root / "predictor-qrf",
        PredictorSettings().max_wait_ms,
        _predictor_calls,
        sample,
        calls,
    )
    return out
