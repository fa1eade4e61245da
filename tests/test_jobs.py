"""Background jobs: settings, app wiring, the exactly-once trace export and the health checks.

The export runs in eager mode for its logic, then in a real Celery worker process (``python -m
services.jobs``) on the private redis-server: broker and backend reach it through its Unix socket
(``redis+socket://``), in database 1, under a per-test key prefix and queue, so nothing here can touch
another test's keys or any other Redis.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pydantic
import pytest
import redis
from celery import Celery
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from services.common import artifacts
from services.common.jobruns import JobRunsCollector, read_runs, recorded
from services.common.keys import Keys
from services.common.redis_proc import PrivateRedis
from services.common.types import EngineProfile, OutcomeRow, TraceRow
from services.jobs import healthcheck
from services.jobs.app import make_app
from services.jobs.config import JobsSettings
from services.jobs.export import export_traces, outcome_file, trace_file
from services.jobs.tasks import EXPORT_TRACES, PROFILE_ENGINE, RETRAIN_PREDICTOR, RETRAIN_ROUTER

ROW = TraceRow(
    request_id="r0", program_id="p0", workflow="code", stage=0, engine="e0", model="m", system_text="s",
    user_text="u", prompt_text="s\nu", prompt_tokens=5, completion_tokens=7, predicted=9, predicted_p90=12,
    queue_wait_s=0.1, run_s=0.2, finish_reason="stop",
)  # fmt: skip


def trace(i: int, engine: str = "e0") -> TraceRow:
    return replace(ROW, request_id=f"r{i}", program_id=f"p{i}", engine=engine, completion_tokens=i)


def add_traces(r: redis.Redis, keys: Keys, engine: str, rows: list[TraceRow]) -> None:
    """What QueueStore's completion script does: register the engine, XADD the row in field ``row``."""
    r.sadd(keys.engines(), engine)
    for row in rows:
        r.xadd(keys.traces(engine), {"row": row.to_json()})


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def sync_redis(private_redis: PrivateRedis) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(private_redis.url, decode_responses=True) as r:
        yield r


@pytest.fixture
def settings(private_redis: PrivateRedis, keys: Keys, tmp_path: Path) -> JobsSettings:
    return JobsSettings(
        redis_url=private_redis.url, key_prefix=keys.prefix, traces_dir=tmp_path / "traces", export_batch=3
    )


@pytest.mark.unit
def test_settings_keep_celery_apart_from_the_dispatcher_and_validate() -> None:
    s = JobsSettings()
    assert s.broker_url.endswith("/1") and s.redis_url.endswith("/0")
    with pytest.raises(pydantic.ValidationError):
        JobsSettings(broker_url="amqp://localhost")
    with pytest.raises(pydantic.ValidationError):
        JobsSettings(celery_key_prefix="no-separator-at-the-end")
    with pytest.raises(pydantic.ValidationError):
        JobsSettings(export_batch=0)


@pytest.mark.unit
def test_environment_configures_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHIMERA_JOBS_QUEUE", "q7")
    monkeypatch.setenv("CHIMERA_JOBS_EXPORT_INTERVAL_S", "0")
    monkeypatch.setenv("CHIMERA_REDIS_URL", "redis://h:1/0")
    s = JobsSettings()
    assert (s.queue, s.export_interval_s, s.redis_url) == ("q7", 0.0, "redis://h:1/0")


@pytest.mark.unit
def test_app_wiring_acks_late_only_on_idempotent_tasks() -> None:
    app = make_app(JobsSettings(queue="qx", celery_key_prefix="px:"))
    assert app.conf.task_default_queue == "qx"
    assert app.conf.task_acks_late is False
    assert app.conf.broker_transport_options["global_keyprefix"] == "px:"
    assert app.conf.result_backend_transport_options["global_keyprefix"] == "px:"
    assert app.tasks[EXPORT_TRACES].acks_late is True
    assert app.conf.beat_schedule["export-traces"]["task"] == EXPORT_TRACES
    assert app.conf.beat_schedule["retrain_router"]["task"] == RETRAIN_ROUTER
    assert make_app(JobsSettings(export_interval_s=0, retrain_interval_s=0)).conf.beat_schedule == {}


@pytest.mark.unit
def test_file_names_never_escape_the_folder(tmp_path: Path) -> None:
    assert trace_file(tmp_path, "../../etc/x").parent == tmp_path
    assert trace_file(tmp_path, "e0").name == "traces-e0.jsonl"
    assert outcome_file(tmp_path).name == "outcomes.jsonl"


@pytest.mark.redis
def test_eager_export_writes_each_row_once(
    settings: JobsSettings, keys: Keys, sync_redis: redis.Redis
) -> None:
    app: Celery = make_app(settings, eager=True)
    add_traces(sync_redis, keys, "e0", [trace(i) for i in range(7)])  # 7 > batch of 3: several batches
    add_traces(sync_redis, keys, "e1", [trace(100, "e1")])
    outcome = OutcomeRow(program_id="p1", workflow="code", model="m", engine="e0", outcome=1.0)
    sync_redis.xadd(keys.outcomes(), {"row": outcome.to_json()})
    sync_redis.xadd(keys.outcomes(), {"program_id": "p2", "model": "m", "outcome": "0"})  # flat fields

    first = app.tasks[EXPORT_TRACES].delay().get(timeout=10)
    assert (first["busy"], first["rows"]) == (False, 10)
    again = app.tasks[EXPORT_TRACES].delay().get(timeout=10)
    assert again["rows"] == 0

    d = settings.traces_dir
    assert [TraceRow.from_json(x) for x in lines(d / "traces-e0.jsonl")] == [trace(i) for i in range(7)]
    assert [TraceRow.from_json(x) for x in lines(d / "traces-e1.jsonl")] == [trace(100, "e1")]
    got = [OutcomeRow.from_json(x) for x in lines(d / "outcomes.jsonl")]
    assert got == [outcome, OutcomeRow(program_id="p2", workflow="", model="m", engine="", outcome=0.0)]

    add_traces(sync_redis, keys, "e0", [trace(7)])
    assert app.tasks[EXPORT_TRACES].delay().get(timeout=10)["rows"] == 1
    assert len(lines(d / "traces-e0.jsonl")) == 8
    assert sync_redis.get(keys.export_lock()) is None  # the lease is released
    runs = read_runs(sync_redis, keys)["export_traces"]
    assert (runs.ok, runs.failed) == (3, 0) and runs.last_ok_unix > 0 and runs.last_failed_unix == 0


@pytest.mark.redis
def test_job_runs_count_failures_and_reach_the_dispatchers_metrics(
    keys: Keys, sync_redis: redis.Redis
) -> None:
    def client() -> redis.Redis:
        return redis.Redis(connection_pool=sync_redis.connection_pool)

    with recorded(client, keys, "retrain_router"):
        pass
    with pytest.raises(RuntimeError), recorded(client, keys, "retrain_router"):
        raise RuntimeError("training diverged")
    runs = read_runs(sync_redis, keys)["retrain_router"]
    assert (runs.ok, runs.failed) == (1, 1) and runs.last_failed_unix >= runs.last_ok_unix > 0

    registry = CollectorRegistry()
    registry.register(JobRunsCollector(sync_redis, keys))
    labels = {"task": "retrain_router"}
    assert registry.get_sample_value("chimera_job_runs_total", {**labels, "result": "failed"}) == 1
    assert (
        registry.get_sample_value("chimera_job_last_success_timestamp_seconds", labels) == runs.last_ok_unix
    )


def test_a_job_whose_record_cannot_be_written_still_returns_its_result(keys: Keys) -> None:
    def unreachable() -> redis.Redis:
        return redis.Redis(port=1, socket_connect_timeout=0.2)  # nothing listens on port 1

    with recorded(unreachable, keys, "export_traces"):
        result = 42
    assert result == 42


@pytest.mark.redis
def test_a_batch_appended_but_never_recorded_is_replaced_not_duplicated(
    settings: JobsSettings, keys: Keys, sync_redis: redis.Redis
) -> None:
    d, s = settings.traces_dir, settings
    add_traces(sync_redis, keys, "e0", [trace(i) for i in range(4)])
    export_traces(sync_redis, keys, d, s.export_batch, s.export_lock_s)
    add_traces(sync_redis, keys, "e0", [trace(4)])
    # A run that died after appending row 4 but before recording the cursor left this behind:
    with trace_file(d, "e0").open("a") as f:
        f.write(trace(4).to_json() + "\n" + '{"half a li')
    report = export_traces(sync_redis, keys, d, s.export_batch, s.export_lock_s)
    (e0,) = [x for x in report.streams if x.stream == keys.traces("e0")]
    assert e0.rows == 1 and e0.truncated_bytes > 0
    assert [TraceRow.from_json(x) for x in lines(trace_file(d, "e0"))] == [trace(i) for i in range(5)]
    cursor = json.loads(sync_redis.hget(keys.export_cursor(), keys.traces("e0")) or "{}")
    assert cursor["bytes"] == trace_file(d, "e0").stat().st_size


@pytest.mark.redis
def test_a_second_run_while_one_holds_the_lease_writes_nothing(
    settings: JobsSettings, keys: Keys, sync_redis: redis.Redis
) -> None:
    add_traces(sync_redis, keys, "e0", [trace(0)])
    sync_redis.set(keys.export_lock(), "someone-else", px=10_000)
    report = export_traces(sync_redis, keys, settings.traces_dir, 10, 5.0)
    assert report.busy and report.rows == 0
    assert not trace_file(settings.traces_dir, "e0").exists()
    assert sync_redis.get(keys.export_lock()) == "someone-else"  # not released by a run that never held it


@pytest.mark.redis
def test_rows_that_do_not_parse_are_skipped_and_not_retried(
    settings: JobsSettings, keys: Keys, sync_redis: redis.Redis
) -> None:
    add_traces(sync_redis, keys, "e0", [trace(0)])
    sync_redis.xadd(keys.traces("e0"), {"row": '{"not": "a trace row"}'})
    add_traces(sync_redis, keys, "e0", [trace(1)])
    report = export_traces(sync_redis, keys, settings.traces_dir, 10, 5.0)
    (e0,) = [x for x in report.streams if x.stream == keys.traces("e0")]
    assert (e0.rows, e0.skipped) == (2, 1)
    assert export_traces(sync_redis, keys, settings.traces_dir, 10, 5.0).rows == 0


@pytest.mark.redis
def test_rows_trimmed_before_export_are_reported(
    settings: JobsSettings, keys: Keys, sync_redis: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    add_traces(sync_redis, keys, "e0", [trace(i) for i in range(3)])
    export_traces(sync_redis, keys, settings.traces_dir, 10, 5.0)
    add_traces(sync_redis, keys, "e0", [trace(i) for i in range(3, 6)])
    sync_redis.xtrim(keys.traces("e0"), maxlen=1, approximate=False)  # the capped stream outran the exporter
    with caplog.at_level("WARNING", logger="services.jobs.export"):
        export_traces(sync_redis, keys, settings.traces_dir, 10, 5.0)
    assert "2 rows were trimmed" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="services.jobs.export"):
        export_traces(sync_redis, keys, settings.traces_dir, 10, 5.0)
    assert "trimmed" not in caplog.text  # reported once
    assert [TraceRow.from_json(x) for x in lines(trace_file(settings.traces_dir, "e0"))] == [
        trace(i) for i in (0, 1, 2, 5)
    ]


@pytest.mark.redis
def test_heartbeat_check(keys: Keys, sync_redis: redis.Redis) -> None:
    assert not healthcheck.check_heartbeat(sync_redis, keys, "e0", 5.0)
    sync_redis.hset(keys.engine_info("e0"), "heartbeat_ms", int(time.time() * 1000))
    assert healthcheck.check_heartbeat(sync_redis, keys, "e0", 5.0)
    sync_redis.hset(keys.engine_info("e0"), "heartbeat_ms", int((time.time() - 60) * 1000))
    assert not healthcheck.check_heartbeat(sync_redis, keys, "e0", 5.0)


@pytest.mark.unit
async def test_grpc_check_follows_the_health_service() -> None:
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    addr = f"127.0.0.1:{port}"
    try:
        await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert await asyncio.to_thread(healthcheck.check_grpc, addr, 2.0)
        await servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert not await asyncio.to_thread(healthcheck.check_grpc, addr, 2.0)
    finally:
        await server.stop(0)
    assert not await asyncio.to_thread(healthcheck.check_grpc, addr, 0.5)
    assert healthcheck.main(["grpc", addr, "--timeout-s", "0.5"]) == 1


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
        "CHIMERA_JOBS_RETRAIN_INTERVAL_S": "0",
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


@pytest.mark.redis
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
        # The prefork child recorded all four runs where the dispatcher's /metrics reads them.
        assert read_runs(r, keys)["export_traces"].ok == 4
    rows = [TraceRow.from_json(x) for x in lines(Path(env["CHIMERA_JOBS_TRACES_DIR"]) / "traces-e0.jsonl")]
    assert rows == [trace(i) for i in range(11)]
    assert healthcheck.check_celery(timeout_s=5.0)
    assert worker.poll() is None
    assert "serving on" in (tmp_path / "worker.log").read_text()


def training_rows(programs: int, seed: int) -> tuple[list[TraceRow], list[OutcomeRow]]:
    """A seeded toy history: two stages per program on one of two models; the big model succeeds more."""
    rng = random.Random(seed)
    traces, outcomes = [], []
    for p in range(programs):
        model, workflow = rng.choice(["small", "big"]), rng.choice(["code", "math"])
        for stage in range(2):
            traces.append(
                replace(
                    ROW,
                    request_id=f"r{seed}-{p}-{stage}",
                    program_id=f"p{seed}-{p}",
                    workflow=workflow,
                    stage=stage,
                    model=model,
                    engine=model,
                    user_text=f"task {p} about {workflow}",
                    completion_tokens=rng.randint(20, 400),
                    enqueued_unix=float(p * 10 + stage),
                )  # fmt: skip
            )
        won = rng.random() < (0.8 if model == "big" else 0.4)
        outcomes.append(OutcomeRow(f"p{seed}-{p}", workflow, model, model, float(won)))
    return traces, outcomes


@pytest.mark.redis
@pytest.mark.parametrize("kind", ["router", "predictor"])
def test_retrain_publishes_once_per_set_of_rows(
    kind: str, settings: JobsSettings, keys: Keys, sync_redis: redis.Redis, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv(f"CHIMERA_{kind.upper()}_ARTIFACT_DIR", str(tmp_path / "artifacts" / kind))
    app = make_app(replace_settings(settings, retrain_min_rows=20), eager=True)
    task = app.tasks[RETRAIN_ROUTER if kind == "router" else RETRAIN_PREDICTOR]
    assert task.acks_late is True
    assert task.delay().get(timeout=60)["skipped"].startswith("0 ")  # nothing exported yet
    traces, outcomes = training_rows(60, seed=1)
    add_traces(sync_redis, keys, "e0", traces)
    for o in outcomes:
        sync_redis.xadd(keys.outcomes(), {"row": o.to_json()})
    first = task.delay().get(timeout=120)  # exports the streams first, then trains on the files
    assert first["version"] and first["skipped"] is None, first
    assert artifacts.current_version(tmp_path / "artifacts" / kind) == first["version"]
    again = task.delay().get(timeout=120)
    assert again["version"] is None and first["version"] in again["skipped"]
    more, more_outcomes = training_rows(10, seed=2)
    add_traces(sync_redis, keys, "e0", more)
    for o in more_outcomes:
        sync_redis.xadd(keys.outcomes(), {"row": o.to_json()})
    third = task.delay().get(timeout=120)
    assert third["version"] not in (None, first["version"])
    assert len(artifacts.versions(tmp_path / "artifacts" / kind)) == 2


@pytest.mark.redis
def test_profile_job_measures_a_simulated_engine_and_publishes_it(
    settings: JobsSettings, keys: Keys, sync_redis: redis.Redis
) -> None:
    app = make_app(settings, eager=True)
    task = app.tasks[PROFILE_ENGINE]
    assert not task.acks_late
    worker = {"engine_id": "e9", "model": "sim", "engine_kind": "simulated", "max_num_seqs": 4,
              "time_scale": 200.0}  # fmt: skip
    got = task.delay(worker, tokens=8, rounds=1, batch_sizes=[1, 2, 4]).get(timeout=60)
    stored = EngineProfile.from_json(sync_redis.hget(keys.profile("e9"), "json") or "")
    assert [b for b, _ in stored.step_ms] == [1, 2, 4]
    assert stored.decode_ms_per_token > 0 and 1 <= stored.max_batch_size <= 4
    assert got["max_batch_size"] == stored.max_batch_size


def replace_settings(s: JobsSettings, **changes: Any) -> JobsSettings:
    return JobsSettings(**{**s.model_dump(), **changes})
