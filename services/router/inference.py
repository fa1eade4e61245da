"""The router's batch function: runs inside the collector's worker processes, on the loaded backend."""

from __future__ import annotations

from dataclasses import dataclass

from services.router.backends import RouterBackend


@dataclass(frozen=True, slots=True)
class RouterItem:
    text: str
    workflow: str


def score_batch(backend: RouterBackend, items: list[RouterItem]) -> list[dict[str, float]]:
    """One {model: confidence} map per item, for every model the backend knows."""
    proba = backend.predict_proba([i.text for i in items], [i.workflow for i in items])
    models = backend.models
    return [{m: float(row[j]) for j, m in enumerate(models)} for row in proba]
