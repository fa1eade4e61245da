"""The loop's background jobs: a real Celery worker of ``services.jobs``, the product's own tasks sent to it
by name, and the wait until the live router and predictor serve what the retrains published.

NOTE(learn jobs): the worker is ``python -m services.jobs`` as compose runs it, a supervised child on the
run's private Redis (broker and results in database 1 under their own key prefix, as its settings say).
Its ``CHIMERA_KEY_PREFIX`` is the learning stack's, so the export reads the learning workflows' traces and
outcomes only: the eval stacks use other prefixes, and their tasks never reach the training rows. Its
``CHIMERA_ROUTER_ARTIFACT_DIR``/``..._PREDICTOR_...`` are the folders the live services watch, which is how
the retrain task finds where to publish. The scheduled export keeps its product default (every 60 s); the
retrains are not scheduled (``retrain_interval_s`` 0) but sent once, when the learning phase has ended,
so that the "after" models are fitted on every label the phase collected.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from celery import Celery

from chimera.predictor.v1 import predictor_pb2, predictor_pb2_grpc
from chimera.router.v1 import router_pb2, router_pb2_grpc
from services.jobs.app import NODE, make_app
from services.jobs.config import JobsSettings
from services.jobs.tasks import EXPORT_TRACES, RETRAIN_PREDICTOR, RETRAIN_ROUTER
from services.launcher.supervisor import Child, Supervisor

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class JobsSetup:
    redis_socket: Path
    key_prefix: str  # the learning stack's: what the export reads
    traces_dir: Path  # where the export writes and the retrains read
    artifacts: Path  # the root the live router and predictor serve from (<root>/router, <root>/predictor)
    state_dir: Path
    min_rows: int  # the retrains' floor (the product default, 50, is more than a short phase may give)

    def env(self) -> dict[str, str]:
        """The worker's environment: the variables its settings and the retrain tasks read."""
        broker = f"redis+socket://{self.redis_socket}?virtual_host=1"
        return {
            "CHIMERA_REDIS_URL": f"unix://{self.redis_socket}",
            "CHIMERA_KEY_PREFIX": self.key_prefix,
            "CHIMERA_JOBS_BROKER_URL": broker,
            "CHIMERA_JOBS_RESULT_BACKEND": broker,
            "CHIMERA_JOBS_CELERY_KEY_PREFIX": f"{self.key_prefix}-celery:",
            "CHIMERA_JOBS_QUEUE": f"{self.key_prefix}-jobs",
            "CHIMERA_JOBS_TRACES_DIR": str(self.traces_dir),
            "CHIMERA_JOBS_STATE_DIR": str(self.state_dir),
            "CHIMERA_JOBS_RETRAIN_INTERVAL_S": "0",
            "CHIMERA_JOBS_RETRAIN_MIN_ROWS": str(self.min_rows),
            "CHIMERA_ROUTER_ARTIFACT_DIR": str(self.artifacts / "router"),
            "CHIMERA_PREDICTOR_ARTIFACT_DIR": str(self.artifacts / "predictor"),
        }

    def settings(self) -> JobsSettings:
        """The same settings in this process (the client side: ``send_task`` needs the broker and queue)."""
        e = self.env()
        return JobsSettings(
            redis_url=e["CHIMERA_REDIS_URL"],
            key_prefix=self.key_prefix,
            broker_url=e["CHIMERA_JOBS_BROKER_URL"],
            result_backend=e["CHIMERA_JOBS_RESULT_BACKEND"],
            celery_key_prefix=e["CHIMERA_JOBS_CELERY_KEY_PREFIX"],
            queue=e["CHIMERA_JOBS_QUEUE"],
            traces_dir=self.traces_dir,
        )


@contextlib.contextmanager
def jobs_worker(setup: JobsSetup, log_path: Path, timeout_s: float = 120.0) -> Iterator[Celery]:
    """A running ``python -m services.jobs`` (up once it answers a Celery ping); yields the client app."""
    app = make_app(setup.settings())
    node = f"{NODE}@{socket.gethostname()}"

    def answers() -> bool:
        return bool(app.control.ping(destination=[node], timeout=1.0))

    sup = Supervisor(python=sys.executable)
    child = sup.add(Child("jobs", [sys.executable, "-m", "services.jobs"], setup.env(), log_path, answers))
    try:
        sup.start_and_wait([child], timeout_s)
        log.info("jobs worker %s up (log %s)", node, log_path)
        yield app
    finally:
        sup.stop_all()
        app.close()


@dataclass(frozen=True, slots=True)
class JobRun:
    task: str
    result: Mapping[str, Any]  # what the task returned (rows, version, skipped...)
    wall_s: float  # sent to result received


def run_job(app: Celery, name: str, timeout_s: float) -> JobRun:
    """Send one of the product's tasks by name to the worker and wait for its result."""
    t0 = time.monotonic()
    result = app.send_task(name).get(timeout=timeout_s)
    out = JobRun(name, dict(result), round(time.monotonic() - t0, 3))
    log.info("%s: %s in %.1f s", name, result, out.wall_s)
    return out


def retrain_and_reload(app: Celery, router_addr: str, predictor_addr: str, timeout_s: float) -> list[JobRun]:
    """Export, retrain the router, wait for the live router to serve it; the same for the predictor. Each
    job's ``result`` gains ``served_after_s``: from the task's result to the live service answering with
    the version it published."""
    out = [run_job(app, EXPORT_TRACES, timeout_s)]
    for name, read in ((RETRAIN_ROUTER, router_version), (RETRAIN_PREDICTOR, predictor_version)):
        job = run_job(app, name, timeout_s)
        version = job.result.get("version")
        if not version:
            raise RuntimeError(f"{name} published nothing: {job.result}")
        addr = router_addr if name == RETRAIN_ROUTER else predictor_addr
        waited = wait_served(functools.partial(read, addr), str(version), 120.0)
        out.append(JobRun(name, {**job.result, "served_after_s": waited}, job.wall_s))
    return out


def router_version(addr: str) -> str:
    """The version the live router answers with (its Describe call)."""
    with grpc.insecure_channel(addr) as ch:
        meta = router_pb2_grpc.RouterStub(ch).Describe(router_pb2.DescribeRequest(), timeout=5.0)
    return str(meta.artifact_version)


def predictor_version(addr: str) -> str:
    """The version the live predictor answers with."""
    with grpc.insecure_channel(addr) as ch:
        meta = predictor_pb2_grpc.PredictorStub(ch).Describe(predictor_pb2.DescribeRequest(), timeout=5.0)
    return str(meta.artifact_version)


def wait_served(read: Callable[[], str], version: str, timeout_s: float, poll_s: float = 0.5) -> float:
    """Seconds until ``read()`` (a live service's version) answers ``version``; raises past ``timeout_s``."""
    t0 = time.monotonic()
    while True:
        seen = read()
        if seen == version:
            return round(time.monotonic() - t0, 3)
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"still serving {seen}, not {version}, after {timeout_s:.0f} s")
        time.sleep(poll_s)
