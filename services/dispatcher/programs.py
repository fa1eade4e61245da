"""Ending a program: cancel its outstanding stage, keep its outcome as a router label, forget its row."""

from __future__ import annotations

from typing import cast

from services.common.keys import ProgramField
from services.common.queue import QueueStore
from services.common.types import OutcomeRow
from services.dispatcher.errors import guarded
from services.dispatcher.handoff import ProgramEnd
from services.dispatcher.tenancy import tenant_of

OUTCOMES_MAXLEN = 1_000_000


async def end_program(
    store: QueueStore, program_id: str, outcome: float | None
) -> tuple[ProgramEnd, dict[str, str]]:
    """End ``program_id`` (a valid, tenant-scoped id); returns the answer and the row it had ({}: none)."""
    r, k, f = store.redis, store.keys, ProgramField
    program = cast(dict[str, str], await guarded(r.hgetall(k.program(program_id))))
    if not program:
        return ProgramEnd(found=False, cancelled_requests=0), program
    engine, rid = program.get(f.ENGINE, ""), program.get(f.REQUEST_ID, "")
    cancelled = 0
    if engine and rid:
        state = await guarded(store.cancel(engine, rid, reason="program ended"))
        cancelled = int(state in ("queued", "running"))
    if outcome is not None:
        row = OutcomeRow(program_id, program.get(f.WORKFLOW, ""), program.get(f.MODEL, ""), engine, outcome)
        await guarded(r.xadd(k.outcomes(), {"row": row.to_json()}, maxlen=OUTCOMES_MAXLEN, approximate=True))
    await guarded(forget(store, program_id))
    return ProgramEnd(found=True, cancelled_requests=cancelled), program


async def forget(store: QueueStore, program_id: str) -> None:
    """Delete a program's row and free its place among its tenant's live workflows (``max_workflows``)."""
    pipe = store.redis.pipeline(transaction=False)
    pipe.delete(store.keys.program(program_id))
    pipe.zrem(store.keys.tenant_workflows(tenant_of(program_id)), program_id)
    await pipe.execute()
