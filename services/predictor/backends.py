"""The predictor backend contract and registry (see ``services.router.backends`` for the same pattern).

A backend predicts quantiles of a workflow's total remaining output tokens (this stage and every later one,
paper §2.2) on the model already chosen. It trains on trace rows and derives the target itself with
``services.common.tracestore.remaining_tokens``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from services.common.types import TraceRow
from services.predictor.features import PredictorInput


@runtime_checkable
class PredictorBackend(Protocol):
    """What the predictor server and the training function need from a backend. Must be picklable."""

    name: str

    @property
    def models(self) -> tuple[str, ...]:
        """Models the backend was trained on; requests for others are refused by the server."""
        ...

    def fit(self, rows: Sequence[TraceRow]) -> None: ...

    def predict(self, rows: Sequence[PredictorInput], quantiles: Sequence[float]) -> npt.NDArray[np.float64]:
        """Array of shape [len(rows), len(quantiles)], non-decreasing along each row."""
        ...


BACKENDS: Mapping[str, str] = MappingProxyType(
    {
        "empirical": "services.predictor.empirical:EmpiricalPredictor",
        "qrf": "services.predictor.qrf:QrfPredictor",
    }
)

# Backends the dispatcher may run itself (CHIMERA_DISPATCHER_INFERENCE=inline): all of today's are numpy and
# scikit-learn on the CPU; a future GPU backend stays out of this set and in the predictor service.
INLINE_BACKENDS: frozenset[str] = frozenset({"empirical", "qrf"})


def make_backend(name: str) -> PredictorBackend:
    """Build an unfitted backend from a registry name or a ``"module:Class"`` path."""
    path = BACKENDS.get(name, name)
    module_name, _, cls_name = path.partition(":")
    if not cls_name:
        raise ValueError(f"unknown predictor backend {name!r}; known: {sorted(BACKENDS)} or 'module:Class'")
    backend = getattr(importlib.import_module(module_name), cls_name)()
    if not isinstance(backend, PredictorBackend):
        raise TypeError(f"{path} does not implement PredictorBackend")
    return backend
