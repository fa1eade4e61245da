"""The jobs' Celery tasks: thin wrappers that read settings, call a domain function and return plain JSON.

``acks_late`` (redelivery when a worker dies mid-task) is set only where a task is idempotent: the export
(cursor + lease) and the retrains (skipped when CURRENT was fitted on the same rows). Profiling re-measures
the hardware, so it is acknowledged on receipt instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from services.common.jobruns import recorded
from services.common.keys import Keys
from services.common.redis_client import connect_sync
from services.jobs import retrain
from services.jobs.config import JobsSettings
from services.jobs.export import Busy, export_traces, lease
from services.jobs.profile import profile_and_store

EXPORT_TRACES = "chimera.jobs.export_traces"
RETRAIN_ROUTER = "chimera.jobs.retrain_router"
RETRAIN_PREDICTOR = "chimera.jobs.retrain_predictor"
PROFILE_ENGINE = "chimera.jobs.profile_engine"

Retrain = Callable[[Path, Path, str | None, int], retrain.RetrainResult]


def register(app: Celery, settings: JobsSettings) -> None:
    keys = Keys(settings.key_prefix)

    def client() -> redis.Redis:
        return connect_sync(settings.redis_url)

    def export() -> dict[str, Any]:
        with client() as r:
            report = export_traces(
                r, keys, settings.traces_dir, settings.export_batch, settings.export_lock_s
            )
        return {"busy": report.busy, "rows": report.rows, "streams": [asdict(s) for s in report.streams]}

    def retrain_with(kind: str, run: Retrain, root: Path, backend: str | None) -> dict[str, Any]:
        export()  # train on every row recorded so far, not only on the last scheduled export
        try:
            with (
                client() as r,
                lease(r, keys.retrain_lock(kind), _ms(settings.retrain_lock_s)),
            ):
                result = run(settings.traces_dir, root, backend, settings.retrain_min_rows)
        except Busy:
            return {"kind": kind, "rows": 0, "version": None, "skipped": "another retrain is running"}
        return asdict(result)

    # shared=False on every task: a shared task is added to every Celery app created later in the process,
    # so a second app (another test, other settings) would silently run the first app's closure.
    @app.task(name=EXPORT_TRACES, acks_late=True, shared=False)  # type: ignore[untyped-decorator]
    def export_traces_task() -> dict[str, Any]:
        with recorded(client, keys, "export_traces"):
            return export()

    @app.task(name=RETRAIN_ROUTER, acks_late=True, shared=False)  # type: ignore[untyped-decorator]
    def retrain_router_task(backend: str | None = None) -> dict[str, Any]:
        from services.router.config import RouterSettings

        # The router serves <root>/router (its own variable, so both agree); training publishes under
        # <root>/<kind>, so the root is its parent.
        root = RouterSettings().artifact_dir.parent
        with recorded(client, keys, "retrain_router"):
            return retrain_with("router", retrain.retrain_router, root, backend or settings.router_backend)

    @app.task(name=RETRAIN_PREDICTOR, acks_late=True, shared=False)  # type: ignore[untyped-decorator]
    def retrain_predictor_task(backend: str | None = None) -> dict[str, Any]:
        from services.predictor.config import PredictorSettings

        root = PredictorSettings().artifact_dir.parent
        with recorded(client, keys, "retrain_predictor"):
            return retrain_with(
                "predictor", retrain.retrain_predictor, root, backend or settings.predictor_backend
            )

    @app.task(name=PROFILE_ENGINE, shared=False)  # type: ignore[untyped-decorator]
    def profile_engine_task(
        worker: dict[str, Any], tokens: int = 64, rounds: int = 2, batch_sizes: list[int] | None = None
    ) -> dict[str, Any]:
        """Measure the engine ``worker`` describes (WorkerSettings fields: engine_id, model, engine_kind...).

        A vLLM engine loads onto this process's accelerator: send the job to a queue that a jobs worker
        consumes on the engine's GPU while that engine's worker is stopped.
        """
        with recorded(client, keys, "profile_engine"):
            profile = asyncio.run(
                profile_and_store(
                    worker, settings.redis_url, keys, settings.profiles_dir, tokens, rounds, batch_sizes
                )
            )
        return asdict(profile)


def _ms(seconds: float) -> int:
    return int(seconds * 1000)
