"""``python -m services.predictor``: wiring only."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from services.common import loop as event_loop
from services.common.logs import setup_logging
from services.common.metrics import ModelServiceMetrics
from services.predictor.config import PredictorSettings
from services.predictor.server import run


def main() -> None:
    settings = PredictorSettings()
    setup_logging("predictor", settings.log_level)
    event_loop.run(run(settings, ModelServiceMetrics(CollectorRegistry(), "predictor")), settings.event_loop)


if __name__ == "__main__":
    main()
