"""End to end through real processes: private redis-server, router, predictor, dispatcher and two workers
(simulated engines) started by the launcher, driven over gRPC by concurrent multi-stage workflows while one
worker is SIGKILLed mid-request and restarted by the supervisor."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest
import redis

from services.common.keys import Keys
from services.demo.client import run_demo
from services.launcher.config import LauncherSettings
from services.launcher.pool import EngineSpec, PoolSpec
from services.launcher.stack import Stack, running_stack
from services.workload.corpus import embedded_corpus

pytestmark = pytest.mark.e2e

PROFILE = {
    "decode_ms_per_token": 33.0,
    "max_batch_size": 4,
    "prefill_ms_per_token": 0.0,
    "step_ms": [[1, 33.0], [16, 51.6]],
}


def _engine(eid: str, model: str, slow: float) -> EngineSpec:
    profile = dict(
        PROFILE, decode_ms_per_token=33.0 * slow, step_ms=[[b, t * slow] for b, t in PROFILE["step_ms"]]
    )  # type: ignore[union-attr]
    # A short lease so that the killed worker's claims come back within the test.
    return EngineSpec(
        id=eid,
        model=model,
        kind="simulated",
        max_num_seqs=4,
        env={"time_scale": "10", "lease_s": "2", "profile_json": json.dumps(profile)},
    )


@pytest.fixture
def stack(tmp_path: Path) -> Stack:
    pool = PoolSpec(
        engines=(
            _engine("small", "Qwen/Qwen2.5-1.5B-Instruct", 1.0),
            _engine("large", "Qwen/Qwen2.5-7B-Instruct", 3.0),
        )
    )
    settings = LauncherSettings.ephemeral(tmp_path)
    with running_stack(settings, pool) as s:
        yield s  # type: ignore[misc]


async def _kill_a_worker_mid_request(stack: Stack, keys: Keys) -> str:
    client = redis.asyncio.Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        for _ in range(600):
            for e in stack.pool.engines:
                if await client.zcard(keys.claims(e.id)) >= 2:
                    child = next(c for c in stack.supervisor.children if c.name == f"worker-{e.id}")
                    assert child.proc is not None
                    os.kill(child.proc.pid, signal.SIGKILL)
                    return e.id
            await asyncio.sleep(0.02)
    finally:
        await client.aclose()
    raise AssertionError("no worker ever held two claims")


def test_concurrent_workflows_survive_a_killed_worker(stack: Stack) -> None:
    keys = Keys(stack.key_prefix)
    corpus = embedded_corpus()

    async def scenario() -> tuple[list, str]:  # type: ignore[type-arg]
        demo = asyncio.create_task(
            run_demo(stack.dispatcher_addr, corpus.problems, n=24, concurrency=24, max_tokens=96, seed=1)
        )
        killed = await _kill_a_worker_mid_request(stack, keys)
        return await asyncio.wait_for(demo, timeout=240), killed

    runs, killed = asyncio.run(scenario())

    assert [r.error for r in runs if not r.completed] == []
    stages = [s for r in runs for s in r.stages]
    assert len(stages) == sum(r.workflow.n_stages for r in runs)
    for r in runs:
        assert len({s.engine for s in r.stages}) == 1, "a workflow must stay on one engine"
    assert any(s.attempts >= 2 for s in stages if s.engine == killed), "the kill hit no running request"
    restarted = next(c for c in stack.supervisor.children if c.name == f"worker-{killed}")
    assert restarted.restarts >= 1

    r = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        traced: Counter[str] = Counter()
        for e in stack.pool.engines:
            for _sid, fields in r.xrange(keys.traces(e.id)):
                traced[json.loads(fields["row"])["request_id"]] += 1
            assert int(r.hget(keys.engine_info(e.id), "load") or 0) == 0
            assert r.hlen(keys.inflight(e.id)) == 0
            assert r.zcard(keys.queue(e.id)) == 0
            assert r.zcard(keys.claims(e.id)) == 0
        assert len(traced) == len(stages), "every stage answered and traced"
        assert set(traced.values()) == {1}, "no stage answered twice"
        assert list(r.scan_iter(keys.program_pattern())) == [], "EndProgram empties the program table"
    finally:
        r.close()
