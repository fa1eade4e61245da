"""The HTTP door's program endpoint: ``POST /v1/programs/{program_id}/end`` ends a workflow and keeps its
outcome, as the gRPC door's ``EndProgram`` does, so a framework on the OpenAI-compatible door can report how
its workflow went (the router learns from it) without a gRPC client."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field

from services.dispatcher.dispatch import Dispatcher


class EndProgramIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    outcome: float | None = Field(default=None, ge=0.0, le=1.0, description="task score, kept as a label")


class ProgramEndpoints:
    def __init__(self, dispatcher: Dispatcher) -> None:
        self._d = dispatcher

    async def end(
        self, program_id: str, request: Request, body: EndProgramIn | None = None
    ) -> dict[str, Any]:
        """Cancel the program's outstanding stage, keep its outcome, forget it; ``found`` false if the
        table did not hold it (already ended, or expired)."""
        tenant = (await self._d.auth.principal(request.headers.get("authorization"))).tenant
        outcome = body.outcome if body is not None else None
        end = await self._d.end_program(program_id, outcome, tenant)
        return {"program_id": program_id, "found": end.found, "cancelled_requests": end.cancelled_requests}
