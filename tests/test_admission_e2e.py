"""Bending instead of breaking, on real processes (redis-server, router, predictor, dispatcher and two
workers over SIMULATED engines, started by the launcher):

- more concurrent streams than the dispatcher's Redis pool holds connections all complete;
- a new workflow over its engine's bound is refused with HTTP 429 + Retry-After and gRPC RESOURCE_EXHAUSTED
  + retry-after, and leaves nothing in Redis;
- a later stage of an admitted workflow gets in over the bound, and a request whose queue wait plus run
  outlast the queue limit is not cut off mid-run.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis

from services.common.keys import Keys
from services.common.types import EngineProfile
from services.launcher.config import LauncherSettings
from services.launcher.pool import EngineSpec, PoolSpec
from services.launcher.stack import Stack, running_stack
from services.sdk import NO_RETRY, AsyncClient, OverloadedError, Sampling

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

# 33 ms steps at batch 1, run 10x faster: 600 tokens take about 2 s.
PROFILE = EngineProfile(33.0, 4, 0.0, ((1, 33.0), (64, 66.0)))
QUEUE_WAIT_S = 3


def _engine(eid: str, model: str, seqs: int, stand_in: str) -> EngineSpec:
    env = {
        "time_scale": "10",
        "profile_json": PROFILE.to_json(),
        "sim_length_median": "1e9",  # every request produces exactly max_tokens
        "sim_length_sigma": "0",
        "prefetch": "0",  # a waiting request waits in the Redis queue, not inside the worker
    }
    return EngineSpec(id=eid, model=model, kind="simulated", max_num_seqs=seqs, stand_in=stand_in, env=env)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # "one" runs one request at a time (a queue forms at once); "wide" has room for every stream.
    pool = PoolSpec(
        engines=(_engine("one", "m-one", 1, "qwen2.5-1.5b"), _engine("wide", "m-wide", 256, "qwen2.5-7b"))
    )
    settings = LauncherSettings.ephemeral(tmp_path_factory.mktemp("bend"))
    env = {
        # Any work at all ahead of a newcomer is over the bound; an idle engine always takes one.
        "CHIMERA_DISPATCHER_MAX_QUEUE_S": "0.001",
        "CHIMERA_DISPATCHER_BROWNOUT_MARGIN": "0",
        "CHIMERA_DISPATCHER_MAX_QUEUE_WAIT_S": str(QUEUE_WAIT_S),
    }
    with running_stack(settings, pool, dispatcher_env=env) as s:
        yield s


@pytest.fixture(scope="module")
def roomy_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # The bound far above what the streams hold: every one is admitted, the test is about holding them.
    pool = PoolSpec(engines=(_engine("wide", "m-wide", 256, "qwen2.5-7b"),))
    settings = LauncherSettings.ephemeral(tmp_path_factory.mktemp("roomy"))
    with running_stack(settings, pool, dispatcher_env={"CHIMERA_DISPATCHER_MAX_QUEUE_S": "86400"}) as s:
        yield s


def _keys_of(stack: Stack) -> set[str]:
    with redis.Redis.from_url(stack.redis_url, decode_responses=True) as r:
        return {k for k in r.scan_iter(match=f"{stack.key_prefix}:*") if ":out:" not in k}


async def test_more_streams_than_the_redis_pool_complete(roomy_stack: Stack) -> None:
    n = 150  # the dispatcher's pool holds 64 connections; the old per-stream reads failed past 100
    body = {
        "model": "m-wide",
        "messages": [{"role": "user", "content": "count to ten"}],
        "max_tokens": 200,
        "stream": True,
    }
    limits = httpx.Limits(max_connections=n + 10)
    base = f"http://{roomy_stack.http_addr}/v1"
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as http:

        async def one() -> tuple[int, str]:
            async with http.stream("POST", "/chat/completions", json=body) as r:
                lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
            return r.status_code, lines[-1] if lines else ""

        results = await asyncio.gather(*(one() for _ in range(n)))
    assert [status for status, _ in results] == [200] * n
    assert all(last == "data: [DONE]" for _, last in results)


async def test_over_the_bound_is_429_and_resource_exhausted_and_leaves_nothing(stack: Stack) -> None:
    async with AsyncClient(stack.dispatcher_addr, retry=NO_RETRY) as client:
        long = client.generate(
            "hold the engine", program_id=f"hold-{uuid.uuid4().hex}", stage=0, workflow="w",
            model="m-one", sampling=Sampling(max_tokens=600),
        )  # fmt: skip
        holder = asyncio.create_task(long)
        await asyncio.sleep(0.5)  # it runs now: "one" has work ahead of any newcomer
        before = _keys_of(stack)
        with pytest.raises(OverloadedError) as refused:
            await client.generate("one more", program_id="refused-grpc", stage=0, workflow="w", model="m-one")
        assert refused.value.code == "RESOURCE_EXHAUSTED" and (refused.value.retry_after_s or 0) >= 1
        async with httpx.AsyncClient(base_url=f"http://{stack.http_addr}/v1", timeout=30) as http:
            r = await http.post(
                "/chat/completions",
                json={"model": "m-one", "messages": [{"role": "user", "content": "and another"}]},
                headers={"X-Chimera-Program-Id": "refused-http"},
            )
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert _keys_of(stack) == before  # no program, no request, no queue entry
        await holder


async def test_a_later_stage_gets_in_over_the_bound_and_is_not_cut_off(stack: Stack) -> None:
    pid = f"wf-{uuid.uuid4().hex}"
    async with AsyncClient(stack.dispatcher_addr) as client:
        first = await client.generate("plan", program_id=pid, stage=0, workflow="w", model="m-one")
        assert first.engine == "one"
        blocker = asyncio.create_task(
            client.generate(
                "hold",
                program_id=f"b-{uuid.uuid4().hex}",
                stage=0,
                workflow="w",
                model="m-one",
                sampling=Sampling(max_tokens=600),
            )  # fmt: skip
        )
        await asyncio.sleep(0.5)
        # Over the bound now, but its workflow was admitted: it queues behind the blocker (~2 s), then
        # runs ~2 s, longer in all than the 3 s queue limit, which must not cut it off mid-run.
        second = await client.generate(
            "code", program_id=pid, stage=1, workflow="w", sampling=Sampling(max_tokens=600)
        )
        await blocker
    assert second.engine == "one" and second.completion_tokens == 600 and second.finish_reason == "length"
    assert second.queue_wait_s > 1.0 and second.e2e_s > QUEUE_WAIT_S


def test_the_stack_is_left_clean(stack: Stack) -> None:
    with redis.Redis.from_url(stack.redis_url, decode_responses=True) as r:
        keys = Keys(stack.key_prefix)
        for eid in ("one", "wide"):
            assert r.zcard(keys.queue(eid)) == 0 and r.hlen(keys.inflight(eid)) == 0
