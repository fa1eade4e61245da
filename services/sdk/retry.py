"""Moved to ``chimera_client.retry`` (see ``services/sdk/__init__.py``)."""

from chimera_client.retry import *  # noqa: F403
