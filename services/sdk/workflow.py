"""Moved to ``chimera_client.workflow`` (see ``services/sdk/__init__.py``)."""

from chimera_client.workflow import *  # noqa: F403
