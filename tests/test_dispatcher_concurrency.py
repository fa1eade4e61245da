"""Eight dispatcher replicas racing on one Redis keep the in-flight accounting exact.

Each replica has its own Redis client; the router and predictor are in-process fakes. Checks: every
engine's ``load`` equals the sum of its ``inflight`` hash and the sum of the predictions dispatched to it;
every program stays on one engine (also when two replicas dispatch its first stage at once); completing
everything through the QueueStore brings every load back to 0.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import zlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from redis.asyncio import Redis

from services.common.keys import Keys
from services.common.queue import QueueStore
from services.common.redis_client import connect_tool
from services.common.redis_proc import PrivateRedis
from services.common.types import ChatMessage, Prediction, SamplingParams, StageRequest, StageResult
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.dispatch import Dispatcher
from services.dispatcher.errors import DuplicateRequest
from services.dispatcher.handoff import Dispatched

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

ENGINES = {"e-small": ("m-small", 5.0, 16), "e-mid": ("m-mid", 10.0, 8), "e-big": ("m-big", 20.0, 8)}
N_REPLICAS = 8
N_PROGRAMS = 90  # x 4 stages = 360, plus 2 racing first stages for each of 20 programs = 400 requests
N_RACING = 20


class FakeRouter:
    """Confidences that differ per replica, so racing replicas would pick different engines."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    async def score(self, text: str, workflow: str, models: Sequence[str]) -> Mapping[str, float]:
        await asyncio.sleep(0)
        return {m: self._rng.random() for m in models}


class FakePredictor:
    """A deterministic, model-specific prediction, so a re-prediction for another model is visible."""

    async def predict(self, request: StageRequest, models: Sequence[str]) -> Mapping[str, Prediction]:
        await asyncio.sleep(0)
        out = {}
        for m in models:
            y = 1 + zlib.crc32(f"{request.request_id}/{m}".encode()) % 700
            out[m] = Prediction(y, 2 * y)
        return out


async def _register(r: Redis, keys: Keys) -> None:
    now_ms = int(time.time() * 1000)
    for eid, (model, ms, batch) in ENGINES.items():
        await r.sadd(keys.engines(), eid)
        await r.hset(
            keys.engine_info(eid),
            mapping={
                "model": model,
                "decode_ms_per_token": ms,
                "max_batch_size": batch,
                "heartbeat_ms": now_ms,
            },
        )


def _req(program: str, stage: int, rid: str) -> StageRequest:
    return StageRequest(
        request_id=rid,
        program_id=program,
        stage=stage,
        workflow="code/planner-coder-qa-coder",
        messages=(ChatMessage("system", "be brief"), ChatMessage("user", f"task of {program}")),
        sampling=SamplingParams(max_tokens=64),
        received_unix=time.time(),
    )


async def test_replicas_keep_inflight_accounting_exact(private_redis: PrivateRedis, keys: Keys) -> None:
    settings = DispatcherSettings(redis_url=private_redis.url, key_prefix=keys.prefix, tau=1.0, delta_s=0.05)
    clients = [connect_tool(private_redis.url) for _ in range(N_REPLICAS)]
    try:
        await _register(clients[0], keys)
        replicas = [
            Dispatcher(QueueStore(c, keys), c, FakeRouter(i), FakePredictor(), settings)
            for i, c in enumerate(clients)
        ]
        rng = random.Random(7)
        results: list[Dispatched] = []

        async def workflow(p: int) -> None:
            for stage in range(4):
                d = rng.choice(replicas)
                results.append(await d.dispatch(_req(f"prog-{p}", stage, f"prog-{p}-s{stage}")))

        async def racing_first_stage(p: int) -> None:
            a, b = rng.sample(replicas, 2)
            pair = await asyncio.gather(
                a.dispatch(_req(f"race-{p}", 0, f"race-{p}-a")),
                b.dispatch(_req(f"race-{p}", 0, f"race-{p}-b")),
            )
            results.extend(pair)

        await asyncio.wait_for(
            asyncio.gather(
                *(workflow(p) for p in range(N_PROGRAMS)), *(racing_first_stage(p) for p in range(N_RACING))
            ),
            timeout=90,
        )
        assert len(results) == 4 * N_PROGRAMS + 2 * N_RACING == 400

        r = clients[0]
        expected: dict[str, int] = defaultdict(int)
        engine_of: dict[str, set[str]] = defaultdict(set)
        for d in results:
            expected[d.engine] += d.prediction.p50
            engine_of[d.request.program_id].add(d.engine)
            # The stored prediction is the one for the engine's model (re-predicted after a lost race).
            assert d.prediction == (await FakePredictor().predict(d.request, [d.model]))[d.model]
            assert ENGINES[d.engine][0] == d.model
        for eid in ENGINES:
            load = int(await r.hget(keys.engine_info(eid), "load") or 0)
            inflight = sum(int(v) for v in await r.hvals(keys.inflight(eid)))
            assert load == inflight == expected[eid], eid
            assert await r.zcard(keys.queue(eid)) == sum(1 for d in results if d.engine == eid)
        assert len(expected) >= 2, "the fake confidences should spread programs over several engines"
        for program, engines in engine_of.items():
            assert len(engines) == 1, f"{program} ran on {engines}"
            assert await r.hget(keys.program(program), "engine") in engines

        store = QueueStore(r, keys)
        branches = [
            json.loads((await store.request_fields(d.engine, d.request.request_id))["decision"])["branch"]
            for d in results
        ]
        # Some racing replicas chose another engine first and had to follow the winner's assignment.
        assert branches.count("reuse-race") >= 1
        for eid in ENGINES:
            while claimed := await store.claim(eid, "fake-worker", 64, lease_s=30):
                for c in claimed:
                    assert await store.complete(c, StageResult("ok", "stop", 3, 1), None)
            assert int(await r.hget(keys.engine_info(eid), "load") or 0) == 0
            assert await r.hlen(keys.inflight(eid)) == 0
    finally:
        for c in clients:
            await c.aclose()


class RacedStore(QueueStore):
    """Lets a copy of the request in just before its own enqueue, as a retry racing its original through
    another replica after every earlier check passed: ENQUEUE is the authority then."""

    async def enqueue(self, engine: str, req: StageRequest, pred: Prediction, *args: Any) -> bool:
        assert await super().enqueue(engine, req, Prediction(5, 5), 5.0, time.time(), {})
        return await super().enqueue(engine, req, pred, *args)


async def test_duplicate_that_wins_the_race_leaves_no_assignment(
    private_redis: PrivateRedis, keys: Keys, redis_client: Redis
) -> None:
    settings = DispatcherSettings(redis_url=private_redis.url, key_prefix=keys.prefix)
    await _register(redis_client, keys)
    store = RacedStore(redis_client, keys)
    d = Dispatcher(store, redis_client, FakeRouter(1), FakePredictor(), settings)
    with pytest.raises(DuplicateRequest):
        await d.dispatch(_req("p-dup", 0, "r-dup"))
    assert not await redis_client.exists(keys.program("p-dup"))
    loads = [int(await redis_client.hget(keys.engine_info(e), "load") or 0) for e in ENGINES]
    assert sorted(loads) == [0, 0, 5]  # only the racing copy is accounted
