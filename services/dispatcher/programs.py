"""Ending a program: cancel its outstanding stage, keep its outcome as a router label, forget its row."""

from __future__ import annotations

from typing import cast

from services.common.keys import ProgramField
from services.common.queue import QueueStore
from services.common.types import OutcomeRow
from services.dispatcher.coalesce import Coalescer
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
    if engine:
        await guarded(store.resume(engine, program_id))  # a tool pause it held ends with it
    if outcome is not None:
        row = OutcomeRow(program_id, program.get(f.WORKFLOW, ""), program.get(f.MODEL, ""), engine, outcome)
        await guarded(r.xadd(k.outcomes(), {"row": row.to_json()}, maxlen=OUTCOMES_MAXLEN, approximate=True))
    await guarded(forget(store, program_id))
    return ProgramEnd(found=True, cancelled_requests=cancelled), program


async def forget(store: QueueStore, *program_ids: str) -> None:
    """Delete programs' rows and free their places among their tenants' live workflows (``max_workflows``),
    in one round trip."""
    pipe = store.redis.pipeline(transaction=False)
    for program_id in program_ids:
        pipe.delete(store.keys.program(program_id))
        pipe.zrem(store.keys.tenant_workflows(tenant_of(program_id)), program_id)
    await pipe.execute()


class Forgetting:
    """Forget finished one-stage programs (every HTTP request without a program is one), those that end
    while a round trip is out sharing the next one (``Coalescer``): at a few hundred requests in flight a
    round trip per request was a tenth of the HTTP door's CPU."""

    def __init__(self, store: QueueStore, max_items: int = 512) -> None:
        self._store = store
        self._batch: Coalescer[str, None] = Coalescer(self._send, max_inflight=1, max_items=max_items)

    async def _send(self, program_ids: list[str]) -> list[None]:
        await guarded(forget(self._store, *program_ids))
        return [None] * len(program_ids)

    async def forget(self, program_id: str) -> None:
        await self._batch.call(program_id)
