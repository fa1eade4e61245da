"""Conversation continuation (``services.dispatcher.conversation``): the canonical form a digest is taken
over, and the Redis side (under a tenant, with its TTL, releasing a finished chat's workflow place) on a
private redis-server."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from services.common.chat import ToolCall
from services.common.keys import Keys
from services.common.types import ChatMessage
from services.dispatcher.conversation import Conversations, answered, digest, probe

SYSTEM, USER = ChatMessage("system", "be brief"), ChatMessage("user", "add 2 and 3")
CALL = ToolCall("call_1", "add", '{"a": 2, "b": 3}')


def _turn_two(call: ToolCall, text: str = "") -> list[ChatMessage]:
    """The history a client sends after running ``call``: its first turn, the call, the tool's result."""
    return [SYSTEM, USER, ChatMessage("assistant", text, (call,)), ChatMessage("tool", "5", call.id)]


@pytest.mark.unit
def test_a_continuation_probes_the_digest_its_first_turn_left() -> None:
    left = answered(None, [SYSTEM, USER], "", [CALL])
    assert probe(None, _turn_two(CALL)) == left
    assert probe(None, [SYSTEM, USER]) is None  # a first turn continues nothing


@pytest.mark.unit
def test_the_digest_ignores_how_a_client_spells_what_it_sends_back() -> None:
    left = answered(None, [SYSTEM, USER], "", [CALL])
    # A framework's own call id, the arguments re-serialised with other spacing and key order, the call's
    # text sent back (or not), and whitespace around the user's text: the same conversation.
    respelled = ToolCall("toolu_9", "add", '{ "b": 3,\n "a": 2 }')
    history = _turn_two(respelled, text="I'll add them.")
    history[1] = ChatMessage("user", "  add 2 and 3\n")
    assert probe(None, history) == left


@pytest.mark.unit
def test_the_digest_sees_what_changes_the_conversation() -> None:
    base = digest(None, [SYSTEM, USER])
    assert digest(None, [SYSTEM, ChatMessage("user", "add 2 and 4")]) != base
    assert digest(None, [ChatMessage("developer", "be brief"), USER]) != base  # the role is part of it
    assert digest(None, [USER, SYSTEM]) != base  # and the order
    assert digest("m-big", [SYSTEM, USER]) != base  # and the model it asks for
    other_args = answered(None, [SYSTEM, USER], "", [ToolCall("call_1", "add", '{"a": 2, "b": 4}')])
    assert other_args != answered(None, [SYSTEM, USER], "", [CALL])
    # A model's malformed arguments are kept as written, so they still match what it is sent back as.
    broken = ToolCall("c", "add", '{"a": 2,')
    assert probe(None, _turn_two(broken)) == answered(None, [SYSTEM, USER], "", [broken])


@pytest.mark.unit
def test_the_probe_is_the_history_up_to_its_last_assistant_turn() -> None:
    second = [SYSTEM, USER, ChatMessage("assistant", "5"), ChatMessage("user", "times 2?")]
    third = [*second, ChatMessage("assistant", "10"), ChatMessage("user", "thanks")]
    assert probe(None, second) == answered(None, [SYSTEM, USER], "5", [])
    assert probe(None, third) == answered(None, second, "10", [])


@pytest.mark.redis
async def test_remembered_answers_are_found_under_their_tenant_only(redis_client: Redis, keys: Keys) -> None:
    convs = Conversations(redis_client, keys, ttl_s=30)
    await redis_client.zadd(keys.tenant_workflows("acme"), {"acme~chat": 1e12, "acme~loop": 1e12})
    await convs.remember("acme", None, [SYSTEM, USER], ("", [CALL]), "loop", "acme~loop")
    chat = [SYSTEM, ChatMessage("user", "hi")]
    await convs.remember("acme", None, chat, ("hello", []), "chat", "acme~chat")

    assert await convs.find("acme", None, _turn_two(CALL)) == "loop"
    assert await convs.find("acme", None, [*chat, ChatMessage("assistant", "hello"), USER]) == "chat"
    assert await convs.find("globex", None, _turn_two(CALL)) is None
    assert await convs.find("acme", None, [SYSTEM, USER]) is None
    ttl = await redis_client.ttl(keys.conversation("acme", answered(None, [SYSTEM, USER], "", [CALL])))
    assert 0 < ttl <= 30
    # The chat's answer called no tool: its place among acme's live workflows is given back; the loop,
    # waiting on its tool, keeps its place.
    assert await redis_client.zrange(keys.tenant_workflows("acme"), 0, -1) == ["acme~loop"]
    # A session's program is found by its session id: its answers keep no digest, a chat still releases.
    await redis_client.zadd(keys.tenant_workflows("acme"), {"acme~ses": 1e12})
    said = [SYSTEM, ChatMessage("user", "session turn")]
    await convs.remember("acme", None, said, ("ok", []), "ses", "acme~ses", by_digest=False)
    assert await convs.find("acme", None, [*said, ChatMessage("assistant", "ok"), USER]) is None
    assert await redis_client.zrange(keys.tenant_workflows("acme"), 0, -1) == ["acme~loop"]
