"""Where a later stage goes: its program's engine; when that engine is dead, the closest live one; after a
failed tool result, a stronger model when escalation is on and pays (``services.policy.escalation``).

NOTE(relocation): the paper keeps a workflow on its engine (its context lives there), and a later stage
whose engine was gone used to wait for it, for up to an hour. Now the stage moves: to another engine of
the same model, else to a model whose router confidence (kept in the program's row since its first stage)
is within the brownout margin of the program's model. The move is recorded in the program's row by ASSIGN
(only if the row still names the dead engine, so replicas moving it at once agree) and in the decision.
An escalation moves the program the same way (ASSIGN's ``moved_from`` is the engine it leaves), so its
later stages follow it to the stronger model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.common.keys import ProgramField
from services.common.types import EngineSnapshot, StageRequest
from services.dispatcher.tool_results import after_failed_tool, history_tokens
from services.policy.contract import NoLiveEngine
from services.policy.escalation import Escalation, escalate
from services.policy.knobs import Knobs
from services.policy.routing import Assignment, Route, follow, relocate


@dataclass(frozen=True, slots=True)
class LaterStage:
    route: Route
    moved_from: str  # the program's dead engine it moved away from; "" when it did not move
    escalation: Escalation | None  # weighed after a failed tool result (escalation on); None otherwise

    @property
    def leaves(self) -> str:
        """The engine the program's row must stop naming (ASSIGN's ``moved_from``); "" when it stays."""
        if self.moved_from:
            return self.moved_from
        return self.escalation.from_engine if self.escalation and self.escalation.to else ""


def assignment(program: Mapping[str, str]) -> Assignment:
    f = ProgramField
    return Assignment(program.get(f.ENGINE, ""), program.get(f.MODEL, ""), int(program.get(f.STAGE) or 0))


def later_stage_route(
    req: StageRequest,
    program: Mapping[str, str],
    engines: Sequence[EngineSnapshot],
    margin: float,
    knobs: Knobs,
) -> LaterStage:
    """The route of a stage of a program that has an engine. Raises what ``follow`` and ``relocate``
    raise."""
    a = assignment(program)
    try:
        route = follow(req.program_id, a, engines, req.stage, req.model_pin)
    except NoLiveEngine:
        # A pinned model may only move to another engine of that model.
        confidences = {} if req.model_pin is not None else _confidences(program)
        return LaterStage(relocate(req.program_id, a, engines, confidences, margin), a.engine_id, None)
    # A pinned model is the caller's choice; escalation only moves what the policy chose.
    if not knobs.escalate or req.model_pin is not None or not after_failed_tool(req.messages):
        return LaterStage(route, "", None)
    current = next(e for e in engines if e.engine_id == a.engine_id)  # follow checked it is alive
    esc = escalate(current, engines, _confidences(program), history_tokens(req.messages), knobs)
    if esc.to is not None:
        route = Route(esc.to.engine_id, esc.to.model, "escalated", None)
    return LaterStage(route, "", esc)


def _confidences(program: Mapping[str, str]) -> dict[str, float]:
    try:
        raw = json.loads(program.get(ProgramField.CONFIDENCES) or "{}")
    except json.JSONDecodeError:
        return {}
    return {str(m): float(c) for m, c in raw.items()} if isinstance(raw, dict) else {}
