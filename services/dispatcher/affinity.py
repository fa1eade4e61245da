"""Where a later stage goes: its program's engine, or, when that engine is dead, the closest live one.

NOTE(relocation): the paper keeps a workflow on its engine (its context lives there), and a later stage
whose engine was gone used to wait for it, for up to an hour. Now the stage moves: to another engine of
the same model, else to a model whose router confidence (kept in the program's row since its first stage)
is within the brownout margin of the program's model. The move is recorded in the program's row by ASSIGN
(only if the row still names the dead engine, so replicas moving it at once agree) and in the decision.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from services.common.keys import ProgramField
from services.common.types import EngineSnapshot, StageRequest
from services.policy.contract import NoLiveEngine
from services.policy.routing import Assignment, Route, follow, relocate


def assignment(program: Mapping[str, str]) -> Assignment:
    f = ProgramField
    return Assignment(program.get(f.ENGINE, ""), program.get(f.MODEL, ""), int(program.get(f.STAGE) or 0))


def later_stage_route(
    req: StageRequest, program: Mapping[str, str], engines: Sequence[EngineSnapshot], margin: float
) -> tuple[Route, str]:
    """The route of a stage of a program that has an engine, and the dead engine it moved from ("" when it
    stays). Raises what ``follow`` and ``relocate`` raise."""
    a = assignment(program)
    try:
        return follow(req.program_id, a, engines, req.stage, req.model_pin), ""
    except NoLiveEngine:
        # A pinned model may only move to another engine of that model.
        confidences = {} if req.model_pin is not None else _confidences(program)
        return relocate(req.program_id, a, engines, confidences, margin), a.engine_id


def _confidences(program: Mapping[str, str]) -> dict[str, float]:
    try:
        raw = json.loads(program.get(ProgramField.CONFIDENCES) or "{}")
    except json.JSONDecodeError:
        return {}
    return {str(m): float(c) for m, c in raw.items()} if isinstance(raw, dict) else {}
