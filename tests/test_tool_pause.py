"""A program's tool pause on a real redis-server (services.common.pause_scripts): a stage that ends in tool
calls keeps its program's predicted remaining work in the engine's load, taking no slot; the next stage (or
the program's end) takes it back; a pause nobody comes back to lapses with the reaper. Then the real
dispatcher doing it for an agent loop's next stage."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest
from redis.asyncio import Redis

from services.common.keys import Keys
from services.common.queue import QueueStore
from services.common.types import ChatMessage, Prediction, SamplingParams, StageRequest, StageResult

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def _req(rid: str, program: str = "loop", pause_ttl_s: float = 600.0, last: bool = False) -> StageRequest:
    return StageRequest(
        rid,
        program,
        0,
        "agent",
        (ChatMessage("user", "write f"),),
        SamplingParams(max_tokens=64),
        last_stage=last,
        pause_ttl_s=pause_ttl_s,
    )


async def _load(r: Redis, keys: Keys) -> int:
    return int(await r.hget(keys.engine_info("e0"), "load") or 0)


async def _run(q: QueueStore, req: StageRequest, y: int, finish: str, output: int) -> None:
    assert await q.enqueue("e0", req, Prediction(y, 2 * y), float(y), time.time(), {})
    claimed = (await q.claim("e0", "w1", 1, lease_s=5))[0]
    assert await q.complete(claimed, StageResult("", finish, 10, output), None)


async def test_a_stage_that_calls_a_tool_keeps_the_rest_of_its_work_in_the_load(
    redis_client: Redis, keys: Keys
) -> None:
    q = QueueStore(redis_client, keys)
    await _run(q, _req("r0"), 300, "tool_calls", 80)
    assert await _load(redis_client, keys) == 220  # ŷ 300 less the 80 tokens the stage produced
    assert await redis_client.hget(keys.paused("e0"), "loop") == "220"
    assert (
        await redis_client.zcard(keys.claims("e0")) == 0 and await redis_client.zcard(keys.queue("e0")) == 0
    )
    # The loop's next stage, on the same engine: the pause ends before its own ŷ is charged.
    assert await q.resume("e0", "loop") == 220
    assert await q.resume("e0", "loop") == 0  # once only
    assert await _load(redis_client, keys) == 0
    await _run(q, _req("r1"), 150, "tool_calls", 50)
    await _run(q, replace(_req("r2"), stage=1), 120, "tool_calls", 20)  # a pause replaces the last one
    assert await _load(redis_client, keys) == 100
    await q.resume("e0", "loop")


@pytest.mark.parametrize(
    ("finish", "req"),
    [("stop", _req("r")), ("tool_calls", _req("r", last=True)), ("tool_calls", _req("r", pause_ttl_s=0))],
    ids=["answered", "last-stage", "no-deadline"],
)
async def test_only_a_stage_that_goes_on_after_a_tool_pauses(
    redis_client: Redis, keys: Keys, finish: str, req: StageRequest
) -> None:
    q = QueueStore(redis_client, keys)
    await _run(q, req, 300, finish, 80)
    assert await _load(redis_client, keys) == 0 and not await redis_client.exists(keys.paused("e0"))


async def test_a_pause_nobody_comes_back_to_lapses_with_the_reaper(redis_client: Redis, keys: Keys) -> None:
    q = QueueStore(redis_client, keys)
    await _run(q, _req("r0", pause_ttl_s=0.2), 300, "tool_calls", 100)
    await q.reap("e0")
    assert await _load(redis_client, keys) == 200  # not yet
    await asyncio.sleep(0.3)
    await q.reap("e0")
    assert await _load(redis_client, keys) == 0 and await redis_client.zcard(keys.pause_deadlines("e0")) == 0


async def test_the_dispatcher_takes_a_pause_back_when_its_loop_comes_back_or_ends(
    redis_client: Redis, keys: Keys
) -> None:
    from test_escalation import FakePredictor, FakeRouter, _engines

    from services.dispatcher.config import DispatcherSettings
    from services.dispatcher.dispatch import Dispatcher

    await _engines(redis_client, keys)  # e0 idle, e1 holding 100 tokens; the fake predictor says 100
    store = QueueStore(redis_client, keys)
    d = Dispatcher(
        store, redis_client, FakeRouter(), FakePredictor(), DispatcherSettings(key_prefix=keys.prefix)
    )

    async def stage(k: int) -> None:
        sent = await d.dispatch(replace(_req(f"loop-{k}"), stage=k))
        assert sent.engine == "e0"
        claimed = (await store.claim("e0", "w1", 1, lease_s=5))[0]
        assert await store.complete(claimed, StageResult("", "tool_calls", 10, 30), None)

    await stage(0)
    assert await _load(redis_client, keys) == 70  # paused: 100 predicted, 30 produced
    await stage(1)  # its dispatch took the first pause back; its own ended in a pause of 70 again
    assert await _load(redis_client, keys) == 70
    assert (await d.end_program("loop", None)).found
    assert await _load(redis_client, keys) == 0 and not await redis_client.exists(keys.paused("e0"))
