"""What the background jobs did, kept in Redis: run and failure counts, last success, last duration.

NOTE(jobruns): the jobs run in Celery's prefork children, which cannot share a Prometheus registry with an
exporter in the parent, and a child's counters die with it. So each run ends by adding to one Redis hash
(``Keys.job_runs``), and the dispatcher's ``/metrics`` reads that hash at scrape time, as it reads the
engines' queues. Operators alert on the last success's age (a retrain that silently stopped), and
``redis-cli HGETALL`` shows the same numbers.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from services.common.keys import Keys

log = logging.getLogger(__name__)

_OK = "ok"
_FAILED = "failed"
_LAST_OK = "last_ok_unix"
_LAST_FAILED = "last_failed_unix"
_LAST_DURATION = "last_duration_s"


@dataclass(frozen=True, slots=True)
class JobRuns:
    """One job's record. Times are unix seconds, 0.0 when it never happened."""

    ok: int = 0
    failed: int = 0
    last_ok_unix: float = 0.0
    last_failed_unix: float = 0.0
    last_duration_s: float = 0.0


def record_run(
    r: redis.Redis, keys: Keys, task: str, ok: bool, duration_s: float, now: float | None = None
) -> None:
    """Add one finished run of ``task`` (one round trip, atomic: MULTI)."""
    now = time.time() if now is None else now
    pipe = r.pipeline(transaction=True)
    pipe.hincrby(keys.job_runs(), f"{task}:{_OK if ok else _FAILED}", 1)
    pipe.hset(
        keys.job_runs(),
        mapping={
            f"{task}:{_LAST_OK if ok else _LAST_FAILED}": now,
            f"{task}:{_LAST_DURATION}": round(duration_s, 6),
        },
    )
    pipe.execute()


def read_runs(r: redis.Redis, keys: Keys) -> dict[str, JobRuns]:
    """Every job that has run at least once, by task name."""
    fields: dict[str, dict[str, str]] = {}
    for name, value in r.hgetall(keys.job_runs()).items():
        task, _, field = str(name).rpartition(":")
        if task:
            fields.setdefault(task, {})[field] = str(value)
    return {
        task: JobRuns(
            ok=int(f.get(_OK, 0)),
            failed=int(f.get(_FAILED, 0)),
            last_ok_unix=float(f.get(_LAST_OK, 0.0)),
            last_failed_unix=float(f.get(_LAST_FAILED, 0.0)),
            last_duration_s=float(f.get(_LAST_DURATION, 0.0)),
        )
        for task, f in sorted(fields.items())
    }


@contextlib.contextmanager
def recorded(
    client: Callable[[], redis.Redis], keys: Keys, task: str, clock: Callable[[], float] = time.monotonic
) -> Iterator[None]:
    """Record the block as one run of ``task``: ok if it returns, failed if it raises (and re-raise).

    A Redis that cannot take the record is logged and never turns a job's result into a failure.
    """
    started = clock()
    ok = False
    try:
        yield
        ok = True
    finally:
        try:
            with client() as r:
                record_run(r, keys, task, ok, clock() - started)
        except RedisError as e:
            log.warning("could not record the %s run (%s)", task, e)


class JobRunsCollector(Collector):
    """The jobs' record as Prometheus series, read from Redis per scrape (in the exporter's thread, with
    its own synchronous client, as the engine gauges are)."""

    def __init__(self, redis_client: redis.Redis, keys: Keys) -> None:
        self._r, self._k = redis_client, keys

    def describe(self) -> Iterable[Metric]:
        return []  # the series depend on which jobs have run

    def collect(self) -> Iterable[Metric]:
        runs = CounterMetricFamily(
            "chimera_job_runs", "finished runs of each background job", labels=["task", "result"]
        )
        last_ok = GaugeMetricFamily(
            "chimera_job_last_success_timestamp_seconds",
            "unix time of the job's last successful run (alert on its age)",
            labels=["task"],
        )
        duration = GaugeMetricFamily(
            "chimera_job_last_duration_seconds", "how long the job's last run took", labels=["task"]
        )
        try:
            record = read_runs(self._r, self._k)
        except RedisError as e:
            log.warning("metrics scrape could not read the jobs' runs: %s", e)
            return []
        for task, jr in record.items():
            runs.add_metric([task, "ok"], jr.ok)
            runs.add_metric([task, "failed"], jr.failed)
            if jr.last_ok_unix:
                last_ok.add_metric([task], jr.last_ok_unix)
            duration.add_metric([task], jr.last_duration_s)
        return [runs, last_ok, duration]
