"""``python -m services.jobs``: the Celery worker of the background jobs (with the scheduler if enabled)."""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import worker_ready

from services.common.logs import setup_logging
from services.jobs.app import NODE, make_app
from services.jobs.config import JobsSettings


def main() -> None:
    settings = JobsSettings()
    setup_logging("jobs", settings.log_level)
    app = make_app(settings)
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        "worker",
        f"--queues={settings.queue}",
        f"--concurrency={settings.concurrency}",
        f"--loglevel={settings.log_level}",
        f"--hostname={NODE}@%h",
    ]
    if settings.beat and app.conf.beat_schedule:
        argv += ["--beat", f"--schedule={settings.state_dir / 'beat-schedule'}"]

    def ready(**_: Any) -> None:
        broker = app.connection_for_read().as_uri()  # without the password
        logging.getLogger("services.jobs").info("serving on %s queue %s", broker, settings.queue)

    worker_ready.connect(ready, weak=False)
    app.worker_main(argv)


if __name__ == "__main__":
    main()
