"""Moved to ``chimera_client.client`` (see ``services/sdk/__init__.py``)."""

from chimera_client.client import *  # noqa: F403
