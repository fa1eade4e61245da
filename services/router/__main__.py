"""``python -m services.router``: wiring only."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from services.common import loop as event_loop
from services.common.logs import setup_logging
from services.common.metrics import ModelServiceMetrics
from services.router.config import RouterSettings
from services.router.server import run


def main() -> None:
    settings = RouterSettings()
    setup_logging("router", settings.log_level)
    event_loop.run(run(settings, ModelServiceMetrics(CollectorRegistry(), "router")), settings.event_loop)


if __name__ == "__main__":
    main()
