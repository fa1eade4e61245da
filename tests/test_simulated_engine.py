"""The simulated engine (a measuring instrument): continuous batching, lengths, step time, abort."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from services.common.types import ChatMessage, EngineProfile, SamplingParams, StageRequest
from services.worker.engine.base import EngineDeadError, EngineOutput
from services.worker.engine.simulated import SimulatedEngine
from services.worker.engine.simulated_inputs import (
    LognormalLengths,
    count_prompt_tokens,
    measured_style_profile,
)

pytestmark = pytest.mark.unit


def _req(
    rid: str, program: str = "p", stage: int = 0, max_tokens: int = 10_000, text: str = ""
) -> StageRequest:
    return StageRequest(
        request_id=rid,
        program_id=program,
        stage=stage,
        workflow="code/coder",
        messages=(ChatMessage("system", "be brief"), ChatMessage("user", text or f"solve task {rid} now")),
        sampling=SamplingParams(max_tokens=max_tokens),
    )


class FixedLengths:
    """A length model for tests: the length is the number after the last '-' of the request id."""

    def __call__(self, request: StageRequest) -> int:
        return int(request.request_id.rsplit("-", 1)[1])


async def _collect(stream: AsyncIterator[EngineOutput]) -> list[EngineOutput]:
    return [out async for out in stream]


def _flat(ms: float, batch: int = 4) -> EngineProfile:
    return EngineProfile(decode_ms_per_token=ms, max_batch_size=batch)


async def test_batch_never_exceeds_max_num_seqs_and_all_finish() -> None:
    eng = SimulatedEngine("m", _flat(1.0), max_num_seqs=3, time_scale=10.0, lengths=FixedLengths())
    await eng.start()
    try:
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, len(eng._running))
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        outs = await asyncio.wait_for(
            asyncio.gather(*(_collect(eng.generate(_req(f"r{i}-{5 + i}"), f"k{i}", i)) for i in range(8))), 10
        )
        watcher.cancel()
    finally:
        await eng.stop()
    assert eng.max_batch_seen == 3 and peak == 3
    assert eng.running() == 0
    for i, out in enumerate(outs):
        assert out[-1].finished and out[-1].finish_reason == "stop"
        assert out[-1].completion_tokens == 5 + i == len(out)
        assert all(not o.finished for o in out[:-1])
        assert out[-1].prompt_tokens == count_prompt_tokens("be brief\n" + f"solve task r{i}-{5 + i} now")


async def test_waiting_sequences_are_admitted_by_priority() -> None:
    eng = SimulatedEngine("m", _flat(1.0), max_num_seqs=1, time_scale=10.0, lengths=FixedLengths())
    await eng.start()
    try:
        # All are queued before the loop runs: the engine must admit lowest priority first, FCFS on ties.
        streams = [
            eng.generate(_req(f"{rid}-2"), rid, prio)
            for rid, prio in [("a", 5), ("b", 1), ("c", 3), ("d", 1)]
        ]
        await asyncio.wait_for(asyncio.gather(*(_collect(s) for s in streams)), 10)
    finally:
        await eng.stop()
    assert list(eng.admission_log) == ["b", "d", "c", "a"]


def test_lengths_are_deterministic_and_keyed_by_stage_not_request_id() -> None:
    model = LognormalLengths(seed=7)
    a = [model(_req(f"x{i}", program=f"p{i}", stage=i % 3)) for i in range(200)]
    b = [model(_req(f"y{i}", program=f"p{i}", stage=i % 3)) for i in range(200)]
    assert a == b
    assert len(set(a)) > 50  # not a constant
    assert a != [LognormalLengths(seed=8)(_req(f"x{i}", program=f"p{i}", stage=i % 3)) for i in range(200)]
    many = sorted(model(_req("r", program=f"q{i}")) for i in range(4000))
    median = many[len(many) // 2]
    assert 150 <= median <= 215  # documented median 180
    assert all(n >= 1 for n in many)


async def test_max_tokens_caps_output_with_length_reason() -> None:
    eng = SimulatedEngine("m", _flat(0.5), time_scale=10.0, lengths=FixedLengths())
    await eng.start()
    try:
        capped = await _collect(eng.generate(_req("a-50", max_tokens=7), "a", 0))
        free = await _collect(eng.generate(_req("b-7", max_tokens=7), "b", 0))
    finally:
        await eng.stop()
    assert (capped[-1].finish_reason, capped[-1].completion_tokens) == ("length", 7)
    assert (free[-1].finish_reason, free[-1].completion_tokens) == ("stop", 7)
    text = "".join(o.text_delta for o in capped)
    assert text.split() and all(w in "be brief solve task a 50 now".split() for w in text.split())


async def test_stream_tokens_sends_the_first_token_alone_then_every_nth_and_loses_no_text() -> None:
    plain = SimulatedEngine("m", _flat(0.5), time_scale=10.0, lengths=FixedLengths())
    chunked = SimulatedEngine("m", _flat(0.5), time_scale=10.0, lengths=FixedLengths(), stream_tokens=4)
    outs = []
    for eng in (plain, chunked):
        await eng.start()
        try:
            outs.append(await _collect(eng.generate(_req("a-11"), "a", 0)))
        finally:
            await eng.stop()
    one, four = outs
    # 11 tokens: the first alone, then tokens 2-4, 5-8, and the last three with the final event.
    assert (len(one), len(four)) == (11, 4)
    assert "".join(o.text_delta for o in one) == "".join(o.text_delta for o in four)
    assert four[0].text_delta == one[0].text_delta
    assert (four[-1].finished, four[-1].completion_tokens) == (True, 11)


def test_profile_step_time_grows_with_batch() -> None:
    p = measured_style_profile()
    assert p.step_time_ms(1) == pytest.approx(33.0)
    assert p.step_time_ms(1) < p.step_time_ms(8) < p.step_time_ms(16) == pytest.approx(51.6)
    assert 16 / (p.step_time_ms(16) / 1000) == pytest.approx(310, rel=0.05)  # ~300 tok/s at 16 streams


async def _timed_run(batch: int) -> float:
    profile = EngineProfile(decode_ms_per_token=10.0, max_batch_size=8, step_ms=((1, 10.0), (8, 40.0)))
    eng = SimulatedEngine("m", profile, time_scale=1.0, lengths=FixedLengths())
    await eng.start()
    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(_collect(eng.generate(_req(f"r{i}-10"), f"k{i}", 0)) for i in range(batch)))
        return time.perf_counter() - t0
    finally:
        await eng.stop()


async def test_step_time_follows_profile_and_time_scale() -> None:
    one = await _timed_run(1)  # 10 steps x 10 ms
    eight = await _timed_run(8)  # 10 steps x 40 ms
    assert 0.098 <= one <= 0.6
    assert 0.39 <= eight <= 1.5
    eng = SimulatedEngine("m", _flat(100.0), time_scale=50.0, lengths=FixedLengths())
    await eng.start()
    t0 = time.perf_counter()
    await _collect(eng.generate(_req("a-10"), "a", 0))  # 10 x 100 ms / 50 = 20 ms
    elapsed = time.perf_counter() - t0
    await eng.stop()
    assert 0.0195 <= elapsed <= 0.5


async def test_prefill_cost_is_charged_on_admission() -> None:
    profile = EngineProfile(decode_ms_per_token=1.0, max_batch_size=4, prefill_ms_per_token=2.0)
    eng = SimulatedEngine("m", profile, time_scale=1.0, lengths=FixedLengths())
    await eng.start()
    t0 = time.perf_counter()
    await _collect(eng.generate(_req("a-1", text=" ".join(["w"] * 100)), "a", 0))  # ~102 prompt tokens
    elapsed = time.perf_counter() - t0
    await eng.stop()
    assert 0.198 <= elapsed <= 1.0


async def test_abort_finishes_cancelled_and_frees_the_slot() -> None:
    eng = SimulatedEngine("m", _flat(5.0), max_num_seqs=1, time_scale=1.0, lengths=FixedLengths())
    await eng.start()
    try:
        long_task = asyncio.create_task(_collect(eng.generate(_req("long-100000"), "long", 0)))
        short_task = asyncio.create_task(_collect(eng.generate(_req("short-3"), "short", 1)))
        await asyncio.sleep(0.05)
        assert eng.running() == 2 and not short_task.done()
        await eng.abort("long")
        long_out = await asyncio.wait_for(long_task, 2)
        short_out = await asyncio.wait_for(short_task, 2)
        await eng.abort("nope")  # unknown keys are ignored
    finally:
        await eng.stop()
    assert long_out[-1].finished and long_out[-1].finish_reason == "cancelled"
    assert 0 < long_out[-1].completion_tokens == len(long_out) - 1
    assert short_out[-1].finish_reason == "stop"
    assert eng.running() == 0


async def test_consumer_that_gives_up_frees_its_slot() -> None:
    eng = SimulatedEngine("m", _flat(1.0), time_scale=10.0, lengths=FixedLengths())
    await eng.start()
    stream = eng.generate(_req("a-1000"), "a", 0)
    async for _ in stream:
        break
    await stream.aclose()  # type: ignore[attr-defined]
    assert eng.running() == 0
    await eng.stop()


async def test_stopped_engine_raises_engine_dead() -> None:
    eng = SimulatedEngine("m", _flat(1.0), lengths=FixedLengths())
    with pytest.raises(EngineDeadError):
        await _collect(eng.generate(_req("a-3"), "a", 0))
    await eng.start()
    task = asyncio.create_task(_collect(eng.generate(_req("b-100000"), "b", 0)))
    await asyncio.sleep(0.02)
    await eng.stop()
    with pytest.raises(EngineDeadError):
        await asyncio.wait_for(task, 2)
