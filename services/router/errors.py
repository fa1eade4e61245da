"""Router domain errors; ``server.py`` maps each to one gRPC status code."""

from __future__ import annotations


class RouterError(Exception):
    """Base of every error the router reports to a caller."""


class BadRequestError(RouterError):
    """The request is malformed (e.g. no items)."""


class TooManyItemsError(RouterError):
    """More items in one request than ``max_request_items``."""


class UnknownModelError(RouterError):
    """A requested model is not in the served artifact."""
