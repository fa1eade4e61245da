"""The program of an HTTP request, around its dispatch: found before it (``http_input``'s NOTE(identity),
then the conversation it continues), and after its answer either remembered for the next turn or forgotten.

A program a client named is the client's to end (``POST /v1/programs/{id}/end``). One that no client named
is never ended by a call: each answer is remembered (``Conversations``) and its row lapses after
``conversation_ttl_s``. A new program whose one request was refused or never answered leaves nothing.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping, Sequence

from services.common.types import ChatMessage
from services.dispatcher.conversation import Conversations
from services.dispatcher.dispatch import Dispatcher
from services.dispatcher.errors import DispatchError
from services.dispatcher.handoff import Dispatched, Final
from services.dispatcher.http_input import Identity, resolve_identity
from services.dispatcher.intake import IdentitySource, pinned
from services.dispatcher.tenancy import scoped

log = logging.getLogger(__name__)


class RequestPrograms:
    def __init__(self, dispatcher: Dispatcher) -> None:
        self._d = dispatcher

    @functools.cached_property
    def conversations(self) -> Conversations:
        # Made on first use: the app is also built without Redis, for its OpenAPI document alone.
        d = self._d
        return Conversations(d.redis, d.store.keys, d.settings.conversation_ttl_s)

    async def identify(
        self,
        tenant: str,
        headers: Mapping[str, str],
        metadata: Mapping[str, str] | None,
        prompt_cache_key: str | None,
        model: str,
        messages: Sequence[ChatMessage],
    ) -> Identity:
        """The request's program: named by the client, else its session, else the conversation it
        continues under ``tenant``, else a new one."""
        ident = resolve_identity(headers, metadata, prompt_cache_key)
        if not ident.new or not self._d.settings.continuation:
            return ident
        continued = await self.conversations.find(tenant, pinned(model.strip()), messages)
        return ident if continued is None else ident.continuing(continued)

    async def refused(self, ident: Identity, tenant: str) -> None:
        """The request was not dispatched: a program made for it alone is forgotten."""
        if ident.new:
            await self._forget(scoped(tenant, ident.program_id))

    async def finished(self, ident: Identity, tenant: str, d: Dispatched, final: Final | None) -> None:
        """The request's stream is over, with its answer (``final``) or without (the caller went away, the
        request failed): an unnamed program's answer is remembered for its continuation."""
        if not ident.unnamed:
            return
        if final is None:
            if ident.new:  # nothing answered: nothing can continue it
                await self._forget(d.request.program_id)
            return
        try:
            # Shielded like the forget: it may run while the handler is being cancelled.
            await asyncio.shield(
                self.conversations.remember(
                    tenant,
                    d.request.model_pin,
                    d.request.messages,
                    (final.text, final.tool_calls),
                    ident.program_id,
                    d.request.program_id,
                    # A session's id finds it again; with continuation off, nothing looks the digest up.
                    by_digest=ident.source != IdentitySource.SESSION and self._d.settings.continuation,
                )
            )
        except (asyncio.CancelledError, DispatchError) as e:
            log.warning("could not remember the conversation of program %s: %r", ident.program_id, e)

    async def _forget(self, program_id: str) -> None:
        # May run while the handler is being cancelled: shield the call so the program is still forgotten.
        # Its one stage already finished or was cancelled on the stream's way out: forgetting is enough.
        try:
            await asyncio.shield(self._d.forget_program(program_id))
        except (asyncio.CancelledError, DispatchError) as e:
            log.warning("could not forget program %s: %r", program_id, e)
