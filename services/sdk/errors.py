"""Moved to ``chimera_client.errors`` (see ``services/sdk/__init__.py``)."""

from chimera_client.errors import *  # noqa: F403
