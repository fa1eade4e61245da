"""A request id seen again: the client's retry re-attaches to the request instead of being refused.

NOTE(idempotency): ``request_id`` is the caller's idempotency key. A caller whose stream broke (a network
blip, a dispatcher restart, a Redis outage longer than the clients ride out) sends the same request again;
the request is still running, or has finished and its output stream is kept for ``finished_ttl_s``. Its
stream is read again from the beginning, so the retry gets the same text and the same final answer, and
the engine does not generate it twice. A caller that goes away has its request cancelled only after
``detach_grace_s``, and not at all if a retry re-attached meanwhile (through any replica: the mark is in
the request's hash). Only the request's own program may do that: the same id under
another program is a client bug, and stays ALREADY_EXISTS.
"""

from __future__ import annotations

from services.common.queue import QueueStore
from services.common.types import StageRequest
from services.dispatcher.decision import Timings, ms_since
from services.dispatcher.handoff import Dispatched


async def reattach(
    store: QueueStore, req: StageRequest, engine: str, model: str, t: Timings, started: float, now: float
) -> Dispatched | None:
    """The existing request to stream again, or None if there is none this request may re-attach to."""
    found = await store.reattach(engine, req.request_id, now)
    if found is None or found.program_id != req.program_id:
        return None
    return Dispatched(
        req,
        engine,
        model,
        found.prediction,
        found.score,
        found.enqueued_unix,
        ms_since(started),
        (),
        "reattach",
        None,  # the first call's stream reports how the request ended; a second report would count it twice
        t.frozen(),
    )
