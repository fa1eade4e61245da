"""Predictor domain errors; ``server.py`` maps each to one gRPC status code."""

from __future__ import annotations


class PredictorError(Exception):
    """Base of every error the predictor reports to a caller."""


class BadRequestError(PredictorError):
    """The request is malformed (no rows, a quantile outside (0, 1))."""


class TooManyRowsError(PredictorError):
    """More rows in one request than ``max_request_items``."""


class UnknownModelError(PredictorError):
    """A row names a model the served artifact was not trained on."""
