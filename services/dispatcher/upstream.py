"""The router and the predictor as a dispatch calls them: timed, counted, and replaced by a fallback when
they fail, because availability beats precision (a slow or broken model service must not stop dispatch)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from services.common.types import Prediction, StageRequest
from services.dispatcher.clients import ConfidenceSource, LengthSource
from services.dispatcher.decision import Timings, ms_since
from services.dispatcher.metrics import DispatcherMetrics

log = logging.getLogger(__name__)


class Upstream:
    def __init__(self, router: ConfidenceSource, predictor: LengthSource, metrics: DispatcherMetrics) -> None:
        self._router = router
        self._predictor = predictor
        self.metrics = metrics

    async def confidences(
        self, req: StageRequest, models: Sequence[str], t: Timings, degraded: list[str]
    ) -> Mapping[str, float]:
        t0, ok = time.perf_counter(), False
        try:
            scores = await self._router.score(req.user_text(), req.workflow, models)
            ok = True
            return scores
        except Exception as e:  # any router failure degrades; availability beats precision
            log.warning("router failed (%s); dispatching %s to the fastest engine", e, req.request_id)
            degraded.append("router")
            return {}
        finally:
            t.router_ms += ms_since(t0)
            self.metrics.upstream("router", time.perf_counter() - t0, ok)

    async def predictions(
        self, req: StageRequest, models: Sequence[str], t: Timings, degraded: list[str]
    ) -> Mapping[str, Prediction]:
        t0, ok = time.perf_counter(), False
        try:
            preds = await self._predictor.predict(req, models)
            ok = set(models) <= set(preds)
            if not ok:
                raise ValueError(f"no prediction for {sorted(set(models) - set(preds))}")
            if req.last_stage:
                # Nothing follows this stage: the workflow's remaining output cannot exceed its max_tokens.
                # Over-predicted, it would inflate the engine's load and its queue bound would refuse work
                # the engine could run.
                y = req.sampling.max_tokens
                return {m: Prediction(p50=min(p.p50, y), p90=min(p.p90, y)) for m, p in preds.items()}
            return preds
        except Exception as e:  # any predictor failure degrades to the request's own bound
            log.warning("predictor failed (%s); using max_tokens for %s", e, req.request_id)
            if "predictor" not in degraded:
                degraded.append("predictor")
            y = req.sampling.max_tokens
            return dict.fromkeys(models, Prediction(p50=y, p90=y))
        finally:
            t.predictor_ms += ms_since(t0)
            self.metrics.upstream("predictor", time.perf_counter() - t0, ok)
