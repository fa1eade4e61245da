"""``Gate``: admission as the dispatcher runs it: the pure rule (``services.policy.admission``) fed with each
engine's measured drain rate, the bound handed to ENQUEUE as the in-flight tokens the engine may hold when
the request joins it (checked there atomically, since concurrent dispatches all read the load before any
of them adds to it), brownouts counted, and refusals worded with when to come back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from services.common.types import EngineSnapshot
from services.dispatcher.drain import DrainMeter
from services.dispatcher.errors import Overloaded
from services.dispatcher.metrics import DispatcherMetrics
from services.policy.admission import Bounds, admit, retry_after_s, work_s
from services.policy.estimates import load_ms_per_token
from services.policy.routing import Route


class Gate:
    def __init__(self, bounds: Bounds, metrics: DispatcherMetrics) -> None:
        self.bounds = bounds
        self.drain = DrainMeter()
        self._metrics = metrics

    def admit(
        self, route: Route, engines: Sequence[EngineSnapshot], confidences: Mapping[str, float]
    ) -> tuple[Route, str, int]:
        """For a new workflow's first stage (later stages are never gated): the policy's choice, or a
        brownout to a close enough engine with room; with the engine the policy chose when it was browned
        out ("" otherwise) and the in-flight tokens the target may hold for the request to join it (0: no
        bound). ``Overloaded`` when no engine has room."""
        b = self.bounds
        adm = admit(route, engines, confidences, b, self.drain.rates())
        if adm.refused:
            raise Overloaded(
                f"engine {route.engine_id} holds {adm.work_s:.1f} s of predicted work, over its bound of "
                f"{b.max_queue_s:g} s; retry in {adm.retry_after_s:.0f} s",
                adm.retry_after_s,
            )
        max_load = 0
        if b.max_queue_s > 0:
            target = next(e for e in engines if e.engine_id == adm.engine_id)
            max_load = max(1, int(b.max_queue_s * 1000.0 / max(1e-12, load_ms_per_token(target))))
        if adm.browned_out_from is None:
            return route, "", max_load
        self._metrics.browned_out(adm.browned_out_from, adm.engine_id)
        return Route(adm.engine_id, adm.model, route.branch, route.selection), adm.browned_out_from, max_load

    def filled(self, engine: EngineSnapshot) -> Overloaded:
        """The refusal for a request whose engine filled past the bound while it was dispatched."""
        excess = max(0.0, work_s(engine) - self.bounds.max_queue_s)
        wait = retry_after_s(engine, excess, self.drain.rates().get(engine.engine_id, 0.0))
        return Overloaded(
            f"engine {engine.engine_id} filled past its bound of {self.bounds.max_queue_s:g} s of predicted "
            f"work while this request was dispatched; retry in {wait:.0f} s",
            wait,
        )
