"""Conversation continuation: a request that carries no program identity is the next stage of the program
whose messages and answer it begins with.

NOTE(continuation): an agent loop driven by a plain OpenAI client sends, turn after turn, the whole
conversation so far: turn N+1's messages are turn N's messages, then turn N's answer (an assistant message,
its tool calls with it), then the tool results or the user's next message. So once a program's stage has
answered, the digest of (its messages + its answer) names the program, kept in Redis under the tenant for
``conversation_ttl_s``; a later request without identity whose messages, up to their last assistant message,
have that digest joins the program as its next stage, on the engine that holds its KV prefix. A tenant's
digest is looked up under that tenant only, so another tenant replaying the same messages starts its own.

The digest is over a canonical form, so that what a client sends back matches what Chimera answered however
the client spells it: text with outer whitespace stripped; an assistant message with tool calls is its calls
alone (name and arguments as canonical JSON), since clients differ on whether they send back its text and
whether as ``null`` or ``""``; tool-call ids are left out (some frameworks mint their own). Two requests that
fork one conversation (the same history twice: a retried turn, a search sampling several next steps) both
find it and are both next stages of the program, on the engine that holds their shared prefix; each answer
leaves its own digest, so each branch goes on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from redis.asyncio import Redis

from services.common.chat import ToolCall
from services.common.keys import Keys
from services.common.types import ChatMessage
from services.dispatcher.coalesce import Coalescer
from services.dispatcher.errors import guarded

ASSISTANT: Final = "assistant"


def _arguments(raw: str) -> str:
    """Tool-call arguments as canonical JSON; text that is not JSON as given (a model's malformed call)."""
    try:
        return json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except ValueError:
        return raw.strip()


def canonical(message: ChatMessage) -> list[str]:
    """One message as the digest sees it (see NOTE(continuation))."""
    if message.role == ASSISTANT and message.tool_calls:
        return [ASSISTANT, *(f"{c.name}({_arguments(c.arguments)})" for c in message.tool_calls)]
    return [message.role, message.content.strip()]


def digest(model: str | None, messages: Sequence[ChatMessage]) -> str:
    """The conversation's name: its canonical messages and the model it asked for (None: Chimera's choice).
    Two loops that ask different models are different conversations even where their texts agree (two
    benchmark arms on one problem); two that ask the same and say the same are one, and share a program."""
    body = json.dumps(
        [model or "", *(canonical(m) for m in messages)], separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(body.encode()).hexdigest()


def answered(
    model: str | None, messages: Sequence[ChatMessage], text: str, tool_calls: Sequence[ToolCall]
) -> str:
    """The digest a stage leaves for its continuation: its messages followed by its answer."""
    return digest(model, [*messages, ChatMessage(ASSISTANT, text, tuple(tool_calls))])


def probe(model: str | None, messages: Sequence[ChatMessage]) -> str | None:
    """The digest an earlier stage would have left if this request continues it: its messages up to and
    including the last assistant message. None when there is none (a first turn continues nothing)."""
    last = max((i for i, m in enumerate(messages) if m.role == ASSISTANT), default=-1)
    return digest(model, messages[: last + 1]) if last >= 0 else None


@dataclass(frozen=True, slots=True)
class _Answered:
    tenant: str
    digest: str | None  # None: the program has a name of its own (a session id), no digest to keep
    program_id: str  # as the client names it
    scoped_program_id: str  # as the program table and the tenant's workflows name it
    still_open: bool  # it asked for a tool call: the loop goes on


class Conversations:
    """Where continuation digests live: ``Keys.conversation`` (tenant, digest) → program id.

    Writes are coalesced (``Coalescer``): at a few hundred header-less answers a second, one pipeline carries
    every answer that finished while the last was out. The same pipeline releases the tenant's workflow place
    of a program whose answer ended its loop (no tool call to answer): the row stays for a continuation,
    but a finished chat does not count against ``max_workflows``."""

    def __init__(self, redis: Redis, keys: Keys, ttl_s: int, max_items: int = 512) -> None:
        self._r, self._k, self.ttl_s = redis, keys, ttl_s
        self._writes: Coalescer[_Answered, None] = Coalescer(self._send, max_inflight=1, max_items=max_items)

    async def find(self, tenant: str, model: str | None, messages: Sequence[ChatMessage]) -> str | None:
        """The (unscoped) id of the program this request continues, or None."""
        key = probe(model, messages)
        if key is None:
            return None
        found = await guarded(self._r.get(self._k.conversation(tenant, key)))
        if found is None:
            return None
        return found.decode() if isinstance(found, bytes) else str(found)

    async def remember(
        self,
        tenant: str,
        model: str | None,
        messages: Sequence[ChatMessage],
        answer: tuple[str, Sequence[ToolCall]],
        program_id: str,
        scoped_program_id: str,
        by_digest: bool = True,
    ) -> None:
        """Name ``program_id`` by its answered conversation (unless ``by_digest`` is false: a session's
        program is found by its session id); a loop that asked for no tool is released."""
        text, calls = answer
        if not by_digest and calls:
            return  # nothing to write
        digest = answered(model, messages, text, calls) if by_digest else None
        await self._writes.call(_Answered(tenant, digest, program_id, scoped_program_id, bool(calls)))

    async def _send(self, items: list[_Answered]) -> list[None]:
        pipe = self._r.pipeline(transaction=False)
        for a in items:
            if a.digest is not None:
                pipe.set(self._k.conversation(a.tenant, a.digest), a.program_id, ex=self.ttl_s)
            if not a.still_open:
                pipe.zrem(self._k.tenant_workflows(a.tenant), a.scoped_program_id)
        await guarded(pipe.execute())
        return [None] * len(items)
