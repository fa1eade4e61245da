"""``python -m services.worker``: one worker for one engine, configured by CHIMERA_WORKER_* variables."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from prometheus_client import CollectorRegistry

from services.common import loop as event_loop
from services.common.keys import Keys
from services.common.logs import setup_logging
from services.common.metrics import start_exporter
from services.common.queue import QueueStore
from services.common.queue_records import Retention
from services.common.redis_client import connect, connect_sync
from services.common.startup import StartupReporter
from services.worker.config import WorkerSettings
from services.worker.engine.base import EngineDeadError
from services.worker.engine.factory import build_engine
from services.worker.metrics import WorkerMetrics
from services.worker.worker import Worker


async def main(s: WorkerSettings, metrics: WorkerMetrics) -> int:
    redis = connect(s.redis_url, s.redis_max_connections, s.redis_outage_s)
    keys = Keys(s.key_prefix)
    store = QueueStore(redis, keys, Retention(max_attempts=s.max_attempts))
    opts = s.options()
    # Every step of the start (weights fetched and converted, engine loaded, first profile) is reported
    # in Redis for the launcher and the health check: a first start takes minutes on a small CPU.
    startup = StartupReporter(
        connect_sync(s.redis_url, socket_timeout=5.0), keys, s.engine_id, opts.worker_id
    )
    worker = Worker(store, redis, build_engine(s, startup), opts, metrics, startup)
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, worker.request_stop)
    try:
        await worker.run()
    except EngineDeadError as exc:  # exit non-zero (the supervisor restarts it); its claims are re-queued
        logging.getLogger("services.worker").error("engine died: %s", exc)
        return 1
    finally:
        await redis.aclose()
    return 0


if __name__ == "__main__":
    settings = WorkerSettings()
    setup_logging("worker", settings.log_level)
    registry = CollectorRegistry()
    exporter = start_exporter(registry, settings.metrics_host, settings.metrics_port)
    code = event_loop.run(
        main(settings, WorkerMetrics(registry, settings.engine_id, settings.model)), settings.event_loop
    )
    if exporter is not None:
        exporter.stop()
    sys.exit(code)
