"""A real Celery worker process (``python -m services.jobs``) on a private redis-server runs the export.

Broker and backend reach the private server through its Unix socket (``redis+socket://``), in database 1,
under a per-test key prefix and queue, so nothing here can touch another test's keys or any other Redis.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from services.common.keys import Keys
from services.common.redis_proc import PrivateRedis
from services.common.types import TraceRow
from services.jobs import healthcheck
from services.jobs.app import EXPORT_TRACES, make_app
from services.jobs.config import JobsSettings
from tests.test_jobs import add_traces, lines, trace

pytestmark = pytest.mark.redis


@pytest.fixture
def env(private_redis: PrivateRedis, keys: Keys, tmp_path: Path) -> dict[str, str]:
    broker = f"redis+socket://{private_redis.socket}?virtual_host=1"
    return {
        "CHIMERA_REDIS_URL": private_redis.url,
        "CHIMERA_KEY_PREFIX": keys.prefix,
        "CHIMERA_JOBS_BROKER_URL": broker,
        "CHIMERA_JOBS_RESULT_BACKEND": broker,
        "CHIMERA_JOBS_CELERY_KEY_PREFIX": f"{keys.prefix}-celery:",
        "CHIMERA_JOBS_QUEUE": f"{keys.prefix}-jobs",
        "CHIMERA_JOBS_CONCURRENCY": "2",
        "CHIMERA_JOBS_TRACES_DIR": str(tmp_path / "traces"),
        "CHIMERA_JOBS_STATE_DIR": str(tmp_path / "state"),
        "CHIMERA_JOBS_EXPORT_BATCH": "4",
        "CHIMERA_JOBS_EXPORT_INTERVAL_S": "0",  # only the tasks this test sends
    }


@pytest.fixture
def worker(env: dict[str, str], tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.jobs"],
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own group: the pool children are ended with it
    )
    yield proc
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log.close()


def test_real_worker_exports_each_row_once(
    worker: subprocess.Popen[bytes], env: dict[str, str], keys: Keys, private_redis: PrivateRedis,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:  # fmt: skip
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    app = make_app(JobsSettings())
    with redis.Redis.from_url(private_redis.url, decode_responses=True) as r:
        add_traces(r, keys, "e0", [trace(i) for i in range(10)])
        # Two runs at once: one exports, the other finds the lease taken (or nothing left to do).
        a, b = app.send_task(EXPORT_TRACES), app.send_task(EXPORT_TRACES)
        results = [a.get(timeout=45), b.get(timeout=45)]
        assert sum(x["rows"] for x in results) == 10, (results, (tmp_path / "worker.log").read_text())
        assert app.send_task(EXPORT_TRACES).get(timeout=20)["rows"] == 0
        add_traces(r, keys, "e0", [trace(10)])
        assert app.send_task(EXPORT_TRACES).get(timeout=20)["rows"] == 1
        # Celery's own keys stay under their prefix in database 1, away from the dispatcher's database 0.
        with redis.Redis(unix_socket_path=str(private_redis.socket), db=1) as celery_db:
            assert celery_db.keys(f"{keys.prefix}-celery:*")
            assert not celery_db.keys(f"{keys.prefix}:*")
    rows = [TraceRow.from_json(x) for x in lines(Path(env["CHIMERA_JOBS_TRACES_DIR"]) / "traces-e0.jsonl")]
    assert rows == [trace(i) for i in range(11)]
    assert healthcheck.check_celery(timeout_s=5.0)
    assert worker.poll() is None
    assert "serving on" in (tmp_path / "worker.log").read_text()
