"""The Celery app of the background jobs, built from settings (no module-level app: tests build their own).

Task names are stable strings so that any process can enqueue a job by name (``app.send_task``) without
importing the task code or its heavy dependencies.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from services.jobs.config import JobsSettings
from services.jobs.tasks import EXPORT_TRACES, RETRAIN_PREDICTOR, RETRAIN_ROUTER, register

NODE = "chimera-jobs"  # worker node name: f"{NODE}@<host>", which the container health check pings


def make_app(settings: JobsSettings, *, eager: bool = False) -> Celery:
    """Build the app and register its tasks. ``eager`` runs tasks inline (unit tests; no broker)."""
    app = Celery("chimera-jobs", set_as_current=False)
    prefix = {"global_keyprefix": settings.celery_key_prefix}
    app.conf.update(
        broker_url="memory://" if eager else settings.broker_url,
        result_backend="cache+memory://" if eager else settings.result_backend,
        broker_transport_options=prefix,
        result_backend_transport_options=prefix,
        broker_connection_retry_on_startup=True,
        task_always_eager=eager,
        task_eager_propagates=eager,
        task_default_queue=settings.queue,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_expires=settings.result_expires_s,
        # Jobs are long and few: a worker takes one at a time so a queued job is never stuck behind a
        # running one in a busy process's prefetch buffer.
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        task_acks_late=False,  # per task, and only where the task is idempotent
        beat_schedule=_schedule(settings),
    )
    register(app, settings)
    return app


def _schedule(settings: JobsSettings) -> dict[str, dict[str, Any]]:
    plan: dict[str, dict[str, Any]] = {}
    if settings.export_interval_s > 0:
        plan["export-traces"] = {"task": EXPORT_TRACES, "schedule": settings.export_interval_s}
    if settings.retrain_interval_s > 0:
        # Retrains skip themselves when no new rows arrived, so a short period costs one export and a hash.
        for name in (RETRAIN_ROUTER, RETRAIN_PREDICTOR):
            plan[name.rsplit(".", 1)[-1]] = {"task": name, "schedule": settings.retrain_interval_s}
    return plan
