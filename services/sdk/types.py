"""Moved to ``chimera_client.types`` (see ``services/sdk/__init__.py``)."""

from chimera_client.types import *  # noqa: F403
