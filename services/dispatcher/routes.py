"""Which engine a stage goes to, and the predictions and confidences that decided it: the routing half of a
dispatch, before anything is written (``dispatch.py`` does the writes).

A first stage asks the router and the predictor at once and lets the policy choose among the candidates,
then the admission gate (``gate.py``) may brown it out to a cheaper engine. A later stage follows its
program (``affinity.py``: stay, move off a dead engine, or escalate after a failed tool result) and asks
the predictor for the model it lands on only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.common.types import EngineSnapshot, Prediction, StageRequest
from services.dispatcher.affinity import later_stage_route
from services.dispatcher.decision import Timings, ms_since
from services.dispatcher.gate import Gate
from services.dispatcher.pending import Claim
from services.dispatcher.upstream import Upstream
from services.policy.contract import Policy
from services.policy.escalation import Escalation
from services.policy.knobs import Knobs
from services.policy.routing import Route, candidates, choose


@dataclass(frozen=True, slots=True)
class Routed:
    route: Route
    preds: Mapping[str, Prediction]  # per model asked for; route.model's is always there
    confidences: Mapping[str, float]  # the router's, on a first stage the policy chose; else empty
    browned_out_from: str = ""
    moved_from: str = ""  # a later stage's dead engine
    leaves: str = ""  # the engine the program's row stops naming (a move or an escalation); "" if none
    escalation: Escalation | None = None
    max_load: int = 0  # in-flight tokens the engine may hold for this request to join (0: no bound)


@dataclass(frozen=True, slots=True)
class Routing:
    """What routing reads besides the request: the upstream services, the policy and its knobs, the gate."""

    up: Upstream
    policy: Policy
    knobs: Knobs
    gate: Gate

    async def route(
        self,
        req: StageRequest,
        program: Mapping[str, str],
        engines: Sequence[EngineSnapshot],
        claim: Claim,
        t: Timings,
        degraded: list[str],
    ) -> tuple[Routed, list[EngineSnapshot]]:
        """The stage's route, and the engines as the decision saw them (a first stage's with the claims
        of dispatches in flight applied). Raises the policy's refusals (``contract.NoLiveEngine``,
        ``AffinityConflict``)."""
        if program:
            later = later_stage_route(req, program, engines, self.gate.bounds.brownout_margin, self.knobs)
            preds = await self.up.predictions(req, [later.route.model], t, degraded)
            routed = Routed(
                later.route,
                preds,
                {},
                moved_from=later.moved_from,
                leaves=later.leaves,
                escalation=later.escalation,
            )
            return routed, list(engines)
        pool = candidates(engines, req.model_pin)
        models = sorted({e.model for e in pool if e.alive})
        confidences: Mapping[str, float] = {}
        if req.model_pin is None:
            # The router and the predictor (for every candidate model) at once: neither waits.
            confidences, preds = await asyncio.gather(
                self.up.confidences(req, models, t, degraded),
                self.up.predictions(req, models, t, degraded),
            )
        else:
            preds = await self.up.predictions(req, models, t, degraded)
        t0 = time.perf_counter()
        pool, seen = claim.applied(pool), claim.applied(list(engines))  # pending.py: no herding
        route = choose(self.policy, pool, confidences, self.knobs, req.model_pin)
        route, browned_out_from, max_load = self.gate.admit(route, seen, confidences)
        claim.take(route.engine_id, preds[route.model].p50)
        t.policy_ms += ms_since(t0)
        return Routed(route, preds, confidences, browned_out_from, max_load=max_load), seen
