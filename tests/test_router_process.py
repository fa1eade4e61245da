"""Router and predictor as real processes (``python -m services.<svc>``): env config, "serving on",
one call, graceful SIGTERM. Both live here because they share the process helpers."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from chimera.predictor.v1 import predictor_pb2, predictor_pb2_grpc
from chimera.router.v1 import router_pb2, router_pb2_grpc
from services.common.types import OutcomeRow, TraceRow
from services.predictor.training import train_predictor
from services.router.training import train_router

pytestmark = pytest.mark.e2e


def _fake_rows() -> tuple[list[TraceRow], list[OutcomeRow]]:
    traces, outcomes = [], []
    for i in range(20):
        pid = f"p{i}"
        traces.append(
            TraceRow(pid, pid, "code", 0, "e0", "m0", "", f"task {i}", "", 1, 1, 0, 0, 0.0, 0.0, "stop")
        )
        outcomes.append(OutcomeRow(pid, "code", "m0", "e0", float(i % 3 == 0)))
    return traces, outcomes


def start_service(
    module: str, env: dict[str, str], timeout_s: float = 60
) -> tuple[subprocess.Popen[str], int]:
    """Start ``python -m <module>`` and return it with the port from its "serving on" line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module],
        env={**os.environ, **env},
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        m = re.search(r"serving on \S+:(\d+)", line)
        if m:
            return proc, int(m.group(1))
    proc.kill()
    proc.wait(10)
    raise AssertionError(f"{module} did not report 'serving on' in {timeout_s}s")


def stop_service(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise


def test_router_process_serves_and_stops_gracefully(tmp_path: Path) -> None:
    traces, outcomes = _fake_rows()
    meta = train_router(traces, outcomes, tmp_path, holdout=0.0)
    env = {
        "CHIMERA_ROUTER_PORT": "0",
        "CHIMERA_ROUTER_ARTIFACT_DIR": str(tmp_path / "router"),
        "CHIMERA_LOG_LEVEL": "INFO",
    }
    proc, port = start_service("services.router", env)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = router_pb2_grpc.RouterStub(channel)
            item = router_pb2.RouterInput(text="task", workflow="code")
            resp = stub.Score(router_pb2.ScoreRequest(items=[item]), timeout=30)
            assert resp.artifact_version == meta.version
            assert 0.0 < resp.scores[0].confidence["m0"] < 1.0
    finally:
        assert stop_service(proc) == 0


def test_predictor_process_serves_and_stops_gracefully(tmp_path: Path) -> None:
    traces, _ = _fake_rows()
    meta = train_predictor(traces, tmp_path, holdout=0.0)
    env = {"CHIMERA_PREDICTOR_PORT": "0", "CHIMERA_PREDICTOR_ARTIFACT_DIR": str(tmp_path / "predictor")}
    proc, port = start_service("services.predictor", env)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = predictor_pb2_grpc.PredictorStub(channel)
            row = predictor_pb2.FeatureRow(model="m0", workflow="code", stage=0)
            resp = stub.Predict(predictor_pb2.PredictRequest(rows=[row]), timeout=30)
            assert resp.artifact_version == meta.version
            assert list(resp.predictions[0].values) == [1.0, 1.0]
    finally:
        assert stop_service(proc) == 0
