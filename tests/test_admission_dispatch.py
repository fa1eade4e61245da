"""Admission in the real dispatcher on real Redis: a brownout is recorded where ``chimera explain`` reads it,
a refusal leaves nothing behind, a later stage gets in over the bound, and a full dispatcher refuses new
workflows. The router and predictor are in-process fakes; the engines' loads are written as a worker's
scripts would leave them."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence

import pytest
from redis.asyncio import Redis

from services.common.keys import EngineField, Keys
from services.common.queue import QueueStore
from services.common.types import ChatMessage, Prediction, SamplingParams, StageRequest
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.dispatch import Dispatcher
from services.dispatcher.errors import Overloaded
from services.inspect.explain import explain

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

# 10 ms per token at batch 10: one in-flight token is 1 ms of predicted work.
ENGINES = {"e0": "m-small", "e1": "m-big"}
CONFIDENCE = {"m-small": 0.6, "m-big": 0.9}


class FakeRouter:
    async def score(self, text: str, workflow: str, models: Sequence[str]) -> Mapping[str, float]:
        return {m: CONFIDENCE[m] for m in models}


class FakePredictor:
    async def predict(self, request: StageRequest, models: Sequence[str]) -> Mapping[str, Prediction]:
        return dict.fromkeys(models, Prediction(100, 200))


async def _engines(r: Redis, keys: Keys, loads: Mapping[str, int]) -> None:
    for eid, model in ENGINES.items():
        await r.sadd(keys.engines(), eid)
        await r.hset(
            keys.engine_info(eid),
            mapping={
                EngineField.MODEL: model,
                EngineField.DECODE_MS_PER_TOKEN: "10",
                EngineField.MAX_BATCH_SIZE: "10",
                EngineField.HEARTBEAT_MS: str(int(time.time() * 1000)),
                EngineField.LOAD: str(loads.get(eid, 0)),
            },
        )


def _dispatcher(r: Redis, keys: Keys, **settings: object) -> Dispatcher:
    # tau this large lets the confident engine win even while loaded, so admission has something to do.
    s = DispatcherSettings(key_prefix=keys.prefix, tau=1e9, max_queue_s=1.0, **settings)  # type: ignore[arg-type]
    return Dispatcher(QueueStore(r, keys), r, FakeRouter(), FakePredictor(), s)


def _req(program: str, stage: int = 0, pin: str | None = None) -> StageRequest:
    return StageRequest(
        f"{program}-{stage}",
        program,
        stage,
        "code/planner-coder",
        (ChatMessage("user", "write a parser"),),
        SamplingParams(max_tokens=64),
        model_pin=pin,
    )


async def test_a_full_engines_new_workflow_is_browned_out_and_the_record_says_so(
    redis_client: Redis, keys: Keys
) -> None:
    await _engines(redis_client, keys, {"e0": 10, "e1": 5000})  # e1 holds 5 s of work, over the 1 s bound
    d = _dispatcher(redis_client, keys, brownout_margin=0.5)
    placed = await d.dispatch(_req("p1"))
    assert (placed.engine, placed.browned_out_from) == ("e0", "e1")
    decision = json.loads(await redis_client.hget(keys.request("e0", "p1-0"), "decision") or "{}")
    assert decision["brownout"] == {"from": "e1", "to": "e0", "max_queue_s": 1.0, "margin": 0.5}
    assert decision["selection"]["engine"] == "e1"  # what the policy chose, before admission moved it
    ex = await explain(redis_client, keys, "p1-0")
    assert any("browned out" in line for line in ex.reasons)
    assert d.metrics.brownouts.labels("e1", "e0")._value.get() == 1


async def test_a_refusal_leaves_nothing_and_a_later_stage_still_gets_in(
    redis_client: Redis, keys: Keys
) -> None:
    await _engines(redis_client, keys, {"e0": 10})
    d = _dispatcher(redis_client, keys, brownout_margin=0.0)
    first = await d.dispatch(_req("p2"))  # on e1, the confident one
    await redis_client.hset(keys.engine_info(first.engine), EngineField.LOAD, "9000")  # now 9 s of work
    before = sorted(await redis_client.keys(f"{keys.prefix}:*"))
    with pytest.raises(Overloaded) as refused:
        await d.dispatch(_req("p3"))  # m-small is not within a 0 margin: no brownout
    assert refused.value.code == "RESOURCE_EXHAUSTED" and refused.value.retry_after_s >= 1.0
    assert sorted(await redis_client.keys(f"{keys.prefix}:*")) == before  # nothing written
    later = await d.dispatch(_req("p2", stage=1))  # its workflow was admitted: it never strands
    assert later.engine == first.engine and later.branch == "reuse"


async def test_a_full_dispatcher_refuses_new_workflows_only(redis_client: Redis, keys: Keys) -> None:
    await _engines(redis_client, keys, {})
    d = _dispatcher(redis_client, keys, max_open_requests=1)
    await d.dispatch(_req("p4"))
    async with d.hub.subscribe("e1", "held-1"), d.hub.subscribe("e1", "held-2"):  # two streams open
        with pytest.raises(Overloaded):
            await d.dispatch(_req("p5"))
        assert (await d.dispatch(_req("p4", stage=1))).branch == "reuse"
    await d.close()


async def test_concurrent_first_stages_cannot_overfill_an_engine(redis_client: Redis, keys: Keys) -> None:
    # All 40 read the same empty engines before any writes: only the bound checked at the write (ENQUEUE)
    # keeps the engine from taking them all. 1 s bound = 1,000 tokens; each brings 100.
    await _engines(redis_client, keys, {"e0": 10_000})  # e0 full: nowhere to brown out to
    d = _dispatcher(redis_client, keys, brownout_margin=0.0)
    before = set(await redis_client.keys(keys.program_pattern()))
    results = await asyncio.gather(*(d.dispatch(_req(f"c{i}")) for i in range(40)), return_exceptions=True)
    placed = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, Overloaded)]
    assert len(placed) + len(refused) == 40, [r for r in results if isinstance(r, BaseException)]
    load = int(await redis_client.hget(keys.engine_info("e1"), EngineField.LOAD) or 0)
    # Admitted while the load was at most the bound: at most one request's tokens past it.
    assert 0 < len(placed) <= 11 and load <= 1_000 + 100, (len(placed), load)
    assert all(r.retry_after_s >= 1.0 for r in refused)
    # A refused first stage leaves no program behind.
    programs = set(await redis_client.keys(keys.program_pattern())) - before
    assert len(programs) == len(placed)
