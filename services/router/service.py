"""The router's request logic between the gRPC edge and the batch collector: validate, score, filter."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.common.artifacts import ArtifactMeta
from services.common.batching import BatchCollector, NoArtifactError
from services.router.errors import BadRequestError, TooManyItemsError, UnknownModelError
from services.router.inference import RouterItem

RouterCollector = BatchCollector[RouterItem, dict[str, float]]


@dataclass(frozen=True, slots=True)
class Scores:
    confidences: tuple[dict[str, float], ...]  # aligned with the request's items
    version: str


class RouterService:
    def __init__(self, collector: RouterCollector, max_request_items: int) -> None:
        self._collector = collector
        self._max_items = max_request_items

    def describe(self) -> ArtifactMeta:
        meta = self._collector.current
        if meta is None:
            raise NoArtifactError("no router artifact loaded yet")
        return meta

    async def score(self, items: Sequence[RouterItem], models: Sequence[str]) -> Scores:
        """Confidences of ``models`` (every known model when empty) for each item, from one version."""
        if not items:
            raise BadRequestError("items is empty")
        if len(items) > self._max_items:
            raise TooManyItemsError(f"{len(items)} items exceed the limit of {self._max_items} per call")
        self._check_models(self.describe().models, models)
        answer = await self._collector.submit_many(items)
        out: list[dict[str, float]] = []
        for conf in answer.results:
            if models:
                # A reload between the check above and the batch may have dropped a model: check again.
                self._check_models(tuple(conf), models)
                conf = {m: conf[m] for m in models}
            out.append(conf)
        return Scores(tuple(out), answer.version)

    @staticmethod
    def _check_models(known: Sequence[str], wanted: Sequence[str]) -> None:
        missing = sorted(set(wanted) - set(known))
        if missing:
            raise UnknownModelError(f"unknown model(s) {missing}; the router knows {sorted(known)}")
