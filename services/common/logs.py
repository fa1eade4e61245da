"""One logging setup for every service process."""

from __future__ import annotations

import logging


def setup_logging(service: str, level: str = "INFO") -> None:
    logging.basicConfig(
        level=level.upper(),
        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s",
    )
