"""Which engines can serve a request at all, by what it asks of the engine: a request that lets the model
call a tool goes only to engines that read tool calls out of their answers (``EngineSnapshot.calls_tools``:
a vLLM engine with a tool parser). Routed anywhere else it could only fail, so the router and the load
balancer never see those engines for it. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from services.common.types import EngineSnapshot, StageRequest
from services.dispatcher.errors import InvalidRequest


def able_engines(req: StageRequest, engines: Sequence[EngineSnapshot]) -> list[EngineSnapshot]:
    """``engines`` that can serve ``req``; refuses by name a request that only engines which cannot
    call tools could serve (a model pinned to them, or a pool without a tool parser)."""
    if req.tool_use is None or not req.tool_use.calls_possible:
        return list(engines)
    able = [e for e in engines if e.calls_tools]
    pinned = req.model_pin
    if (
        pinned is not None
        and any(e.model == pinned for e in engines)
        and not any(e.model == pinned for e in able)
    ):
        raise InvalidRequest(
            f"model {pinned!r} cannot call tools (its engines have no tool_parser in the pool file): send "
            'tool_choice "none", or pick a model that can'
        )
    if engines and not able:
        raise InvalidRequest(
            "no engine of the pool can call tools (none has a tool_parser in the pool file): send "
            'tool_choice "none"'
        )
    return able
