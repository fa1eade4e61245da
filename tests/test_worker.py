"""The worker against a real redis-server, with the simulated engine (a measuring instrument) at a high
time scale: streaming, admission control, cancellation, priority order, leases and failures."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from services.common.keys import Keys
from services.common.queue import QueueStore
from services.common.types import (
    ChatMessage,
    EngineProfile,
    Prediction,
    SamplingParams,
    StageRequest,
    TraceRow,
)
from services.worker.engine.base import EngineDeadError, EngineRequestError
from services.worker.engine.simulated import SimulatedEngine
from services.worker.engine.simulated_inputs import measured_style_profile
from services.worker.worker import Worker, WorkerOptions

pytestmark = pytest.mark.redis

ENGINE = "e0"


class FixedLengths:
    """Test length model: the output length is the number after the last '-' of the request id."""

    def __call__(self, request: StageRequest) -> int:
        return int(request.request_id.rsplit("-", 1)[1])


def _req(rid: str, deadline: float | None = None, stream: bool = True) -> StageRequest:
    return StageRequest(
        request_id=rid,
        program_id=f"prog-{rid}",
        stage=0,
        workflow="math/solver",
        messages=(ChatMessage("system", "You solve maths."), ChatMessage("user", f"What is {rid} plus two?")),
        sampling=SamplingParams(max_tokens=100_000),
        deadline_unix=deadline,
        stream=stream,
    )


def _engine(max_num_seqs: int, time_scale: float, profile: EngineProfile | None = None) -> SimulatedEngine:
    return SimulatedEngine(
        "sim-m", profile or measured_style_profile(), max_num_seqs, time_scale, lengths=FixedLengths()
    )


def _worker(r: Redis, keys: Keys, engine: SimulatedEngine, **kw: Any) -> Worker:
    opts = WorkerOptions(engine_id=ENGINE, kind="simulated", worker_id="w-test", claim_wait_s=0.1, **kw)
    return Worker(QueueStore(r, keys), r, engine, opts)


async def _enqueue(
    q: QueueStore, rid: str, score: float, deadline: float | None = None, stream: bool = True
) -> None:
    req = _req(rid, deadline, stream)
    assert await q.enqueue(ENGINE, req, Prediction(10, 20), score, time.time(), {"t": "test"})


async def _events(r: Redis, keys: Keys, rid: str) -> list[dict[str, Any]]:
    return [json.loads(f["ev"]) for _id, f in await r.xrange(keys.output(ENGINE, rid))]


async def _load(r: Redis, keys: Keys) -> int:
    return int(await r.hget(keys.engine_info(ENGINE), "load") or 0)


async def _until(cond: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def _finished(r: Redis, keys: Keys, rid: str) -> bool:
    return any(e["t"] in ("final", "error") for e in await _events(r, keys, rid))


async def test_burst_streams_every_request_and_bounds_admission(redis_client: Redis, keys: Keys) -> None:
    q = QueueStore(redis_client, keys)
    rids = [f"r{i}-{3 + 4 * i}" for i in range(12)]
    for i, rid in enumerate(rids):
        await _enqueue(q, rid, float(i))
    assert await _load(redis_client, keys) == 120
    worker = _worker(redis_client, keys, _engine(3, 20.0), prefetch=2, burst=True)
    run = asyncio.create_task(worker.run())
    peak_claims = 0
    while not run.done():
        peak_claims = max(peak_claims, await redis_client.zcard(keys.claims(ENGINE)))
        await asyncio.sleep(0.002)
    await run
    assert 3 <= peak_claims <= 3 + 2
    assert await _load(redis_client, keys) == 0
    assert await redis_client.zcard(keys.claims(ENGINE)) == 0

    for rid in rids:
        evs = await _events(redis_client, keys, rid)
        assert [e["t"] for e in evs[:-1]] == ["delta"] * (len(evs) - 1) and len(evs) >= 2
        final = evs[-1]
        assert final["t"] == "final" and final["finish_reason"] == "stop"
        assert final["text"] == "".join(e["text"] for e in evs[:-1])
        assert final["completion_tokens"] == int(rid.rsplit("-", 1)[1]) == len(final["text"].split())
        assert (final["engine"], final["model"], final["attempt"]) == (ENGINE, "sim-m", 1)
        assert final["queue_wait_s"] >= 0 and final["predicted"] == 10 and final["predicted_p90"] == 20

    rows = [TraceRow.from_json(f["row"]) for _id, f in await redis_client.xrange(keys.traces(ENGINE))]
    assert sorted(row.request_id for row in rows) == sorted(rids)
    for row in rows:
        assert row.completion_tokens == int(row.request_id.rsplit("-", 1)[1])
        assert row.prompt_tokens > 0 and row.user_text.startswith("What is") and row.engine == ENGINE
        assert row.system_text == "You solve maths." and row.run_s > 0

    info = await redis_client.hgetall(keys.engine_info(ENGINE))
    assert await redis_client.sismember(keys.engines(), ENGINE)
    assert info["model"] == "sim-m" and info["kind"] == "simulated" and info["max_num_seqs"] == "3"
    assert EngineProfile.from_json(info["profile"]) == measured_style_profile()
    assert float(info["decode_ms_per_token"]) == 33.0 and int(info["heartbeat_ms"]) > 0
    assert float(info["time_scale"]) == 20.0 and info["worker_id"] == "w-test"


async def test_stored_measured_profile_is_preferred(redis_client: Redis, keys: Keys) -> None:
    measured = EngineProfile(decode_ms_per_token=7.5, max_batch_size=9, step_ms=((1, 7.5), (9, 12.0)))
    await redis_client.hset(keys.profile(ENGINE), "json", measured.to_json())
    await _worker(redis_client, keys, _engine(2, 50.0), burst=True).run()
    info = await redis_client.hgetall(keys.engine_info(ENGINE))
    assert EngineProfile.from_json(info["profile"]) == measured
    assert info["max_batch_size"] == "9" and info["profile_source"] == "measured"


async def test_cancel_while_running_frees_the_slot(redis_client: Redis, keys: Keys) -> None:
    q = QueueStore(redis_client, keys)
    await _enqueue(q, "long-100000", 1.0)
    await _enqueue(q, "next-5", 2.0)
    engine = _engine(1, 10.0)
    worker = _worker(redis_client, keys, engine, prefetch=0, lease_s=1.5)
    run = asyncio.create_task(worker.run())
    try:

        async def long_streaming() -> bool:
            return len(await _events(redis_client, keys, "long-100000")) >= 2

        await _until(long_streaming)
        assert not await _finished(redis_client, keys, "next-5")  # the only slot is taken
        assert await q.cancel(ENGINE, "long-100000") == "running"
        await _until(lambda: _finished(redis_client, keys, "long-100000"), 5)
        await _until(lambda: _finished(redis_client, keys, "next-5"), 5)
    finally:
        worker.request_stop()
        await asyncio.wait_for(run, 10)
    evs = await _events(redis_client, keys, "long-100000")
    final = evs[-1]
    assert final["t"] == "final" and final["finish_reason"] == "cancelled"
    assert [e["t"] for e in evs].count("final") == 1
    assert final["text"] == "".join(e["text"] for e in evs[:-1]) and final["completion_tokens"] > 0
    assert (await _events(redis_client, keys, "next-5"))[-1]["finish_reason"] == "stop"
    assert await _load(redis_client, keys) == 0
    rows = [TraceRow.from_json(f["row"]) for _id, f in await redis_client.xrange(keys.traces(ENGINE))]
    assert [row.request_id for row in rows] == ["next-5"]  # a cancelled stage is no training row


async def test_saturated_engine_starts_requests_in_score_order(redis_client: Redis, keys: Keys) -> None:
    q = QueueStore(redis_client, keys)
    await _enqueue(q, "blocker-40", 0.0)
    engine = _engine(1, 10.0)
    worker = _worker(redis_client, keys, engine, prefetch=0)
    run = asyncio.create_task(worker.run())
    try:

        async def blocker_running() -> bool:
            return "blocker-40:1" in engine.admission_log

        await _until(blocker_running)
        scores = {"a-2": 50.0, "b-2": 10.0, "c-2": 40.0, "d-2": 20.0, "e-2": 30.0}
        for rid, score in scores.items():  # arrive in an order unrelated to their scores
            await _enqueue(q, rid, score)
        assert not await _finished(redis_client, keys, "blocker-40")
        for rid in scores:
            await _until(lambda rid=rid: _finished(redis_client, keys, rid))  # type: ignore[misc]
    finally:
        worker.request_stop()
        await asyncio.wait_for(run, 10)
    started = [k.split(":")[0] for k in engine.admission_log]
    assert started == ["blocker-40", *sorted(scores, key=scores.__getitem__)]


async def test_expired_deadline_fails_without_running(redis_client: Redis, keys: Keys) -> None:
    q = QueueStore(redis_client, keys)
    await _enqueue(q, "late-5", 1.0, deadline=time.time() - 1)
    await _enqueue(q, "fine-5", 2.0, deadline=time.time() + 60)
    engine = _engine(2, 50.0)
    await _worker(redis_client, keys, engine, burst=True).run()
    late = await _events(redis_client, keys, "late-5")
    assert [e["t"] for e in late] == ["error"] and late[0]["code"] == "DEADLINE_EXCEEDED"
    assert (await _events(redis_client, keys, "fine-5"))[-1]["finish_reason"] == "stop"
    assert list(engine.admission_log) == ["fine-5:1"]
    assert await _load(redis_client, keys) == 0


async def test_lost_lease_is_dropped_and_the_rerun_answers_once(redis_client: Redis, keys: Keys) -> None:
    q = QueueStore(redis_client, keys)
    await _enqueue(q, "x-60", 1.0)
    engine = _engine(1, 5.0)
    worker = _worker(redis_client, keys, engine, lease_s=1.5)
    run = asyncio.create_task(worker.run())
    try:
        await _until(lambda: _streaming(redis_client, keys, "x-60"))
        # Pretend the lease expired (a stalled worker): the reaper re-queues it as attempt 2.
        await redis_client.zadd(keys.claims(ENGINE), {"x-60": 0})
        assert await q.reap(ENGINE) == ["x-60"]
        await _until(lambda: _finished(redis_client, keys, "x-60"), 10)
    finally:
        worker.request_stop()
        await asyncio.wait_for(run, 10)
    evs = await _events(redis_client, keys, "x-60")
    finals = [e for e in evs if e["t"] == "final"]
    assert len(finals) == 1 and finals[0]["attempt"] == 2 and finals[0]["completion_tokens"] == 60
    assert finals[0]["text"] == "".join(e["text"] for e in evs if e["t"] == "delta" and e["a"] == 2)
    assert list(engine.admission_log) == ["x-60:1", "x-60:2"]
    assert await _load(redis_client, keys) == 0


async def _streaming(r: Redis, keys: Keys, rid: str) -> bool:
    return any(e["t"] == "delta" for e in await _events(r, keys, rid))


class RaisingEngine(SimulatedEngine):
    """A fake: the simulated engine, except that requests whose id starts with 'boom' raise."""

    def generate(self, request: StageRequest, key: str, priority: int) -> Any:
        if request.request_id.startswith("boom"):
            raise ValueError("engine rejected the request")
        return super().generate(request, key, priority)


async def test_engine_exception_fails_only_that_request(redis_client: Redis, keys: Keys) -> None:
    q = QueueStore(redis_client, keys)
    await _enqueue(q, "boom-5", 1.0)
    await _enqueue(q, "ok-5", 2.0)
    engine = RaisingEngine("sim-m", measured_style_profile(), 2, 50.0, lengths=FixedLengths())
    await _worker(redis_client, keys, engine, burst=True).run()
    boom = await _events(redis_client, keys, "boom-5")
    assert [e["t"] for e in boom] == ["error"] and boom[0]["code"] == "INTERNAL"
    assert (await _events(redis_client, keys, "ok-5"))[-1]["finish_reason"] == "stop"
    assert await _load(redis_client, keys) == 0


async def test_dead_engine_stops_the_worker_and_hands_its_claims_back(
    redis_client: Redis, keys: Keys
) -> None:
    q = QueueStore(redis_client, keys)
    await _enqueue(q, "y-100000", 1.0)
    engine = _engine(1, 5.0)
    worker = _worker(redis_client, keys, engine)
    run = asyncio.create_task(worker.run())
    await _until(lambda: _streaming(redis_client, keys, "y-100000"))
    await engine.stop()  # the engine dies under the worker
    with pytest.raises(EngineDeadError):
        await asyncio.wait_for(run, 10)
    assert not await _finished(redis_client, keys, "y-100000")
    # Back in the queue at once (not after its lease), charged with the death it was running in.
    assert await redis_client.zscore(keys.claims(ENGINE), "y-100000") is None
    assert await redis_client.zscore(keys.queue(ENGINE), "y-100000") == 1.0
    fields = await q.request_fields(ENGINE, "y-100000")
    assert (fields["state"], fields["deaths"], json.loads(fields["died_on"])) == ("queued", "1", ["w-test"])
    info = await redis_client.hgetall(keys.engine_info(ENGINE))
    assert (info["health"], info["heartbeat_ms"]) == ("dead", "0")  # the dispatcher routes nothing to it


async def test_max_requests_stops_claiming(redis_client: Redis, keys: Keys) -> None:
    q = QueueStore(redis_client, keys)
    for i in range(5):
        await _enqueue(q, f"m{i}-3", float(i))
    worker = _worker(redis_client, keys, _engine(4, 50.0), max_requests=3)
    await asyncio.wait_for(worker.run(), 10)
    assert worker.claimed_total == worker.completed_total == 3
    assert await redis_client.zrange(keys.queue(ENGINE), 0, -1) == ["m3-3", "m4-3"]
    assert await _load(redis_client, keys) == 20


async def test_a_freed_slot_is_refilled_without_waiting_for_the_poll(redis_client: Redis, keys: Keys) -> None:
    q = QueueStore(redis_client, keys)
    for i in range(10):
        await _enqueue(q, f"s{i}-2", float(i))
    opts = WorkerOptions(
        engine_id=ENGINE, kind="simulated", worker_id="w", prefetch=0, claim_wait_s=1.0, burst=True
    )
    worker = Worker(q, redis_client, _engine(1, 50.0), opts)
    t0 = time.monotonic()
    await asyncio.wait_for(worker.run(), 20)
    # Ten one-at-a-time requests of ~1.3 ms each: one poll timeout per request would take 10 s.
    assert time.monotonic() - t0 < 3.0 and worker.completed_total == 10


async def test_deltas_are_coalesced_but_the_first_token_is_sent_at_once(
    redis_client: Redis, keys: Keys
) -> None:
    q = QueueStore(redis_client, keys)
    await _enqueue(q, "big-600", 1.0)
    await _worker(redis_client, keys, _engine(1, 2000.0), burst=True).run()
    evs = await _events(redis_client, keys, "big-600")
    deltas = [e["text"] for e in evs if e["t"] == "delta"]
    assert len(deltas[0].split()) == 1  # the first token alone
    assert 1 < len(deltas) < 600 // 4  # far fewer stream entries than tokens
    assert evs[-1]["text"] == "".join(deltas)


async def test_a_request_nobody_streams_writes_its_final_event_and_no_delta(
    redis_client: Redis, keys: Keys
) -> None:
    q = QueueStore(redis_client, keys)
    await _enqueue(q, "whole-300", 1.0, stream=False)
    await _enqueue(q, "streamed-300", 2.0)
    worker = _worker(redis_client, keys, _engine(2, 2000.0), burst=True)
    await worker.run()
    whole, streamed = (
        await _events(redis_client, keys, "whole-300"),
        await _events(redis_client, keys, "streamed-300"),
    )
    assert [e["t"] for e in whole] == ["final"]
    assert whole[0]["completion_tokens"] == 300 == len(whole[0]["text"].split())
    assert streamed[-1]["text"] != "" and len(streamed) > 1  # the streamed one beside it still streams
    assert worker.deltas_published() == len(streamed) - 1


async def _one_whole_request_ended(
    redis_client: Redis, keys: Keys, end: Callable[[QueueStore, SimulatedEngine], Awaitable[None]], **kw: Any
) -> list[dict[str, Any]]:
    """Run one long request nobody streams on a worker with ``kw``, end it with ``end``; its events, once
    the engine has let go of it too (not only its stream)."""
    q = QueueStore(redis_client, keys)
    await _enqueue(q, "whole-100000", 1.0, stream=False)
    engine = _engine(1, 10.0)
    worker = _worker(redis_client, keys, engine, prefetch=0, **kw)
    run = asyncio.create_task(worker.run())
    try:
        await end(q, engine)
        await _until(lambda: _finished(redis_client, keys, "whole-100000"), 5)
        assert engine.running() == 0
    finally:
        worker.request_stop()
        await asyncio.wait_for(run, 10)
    return await _events(redis_client, keys, "whole-100000")


async def test_a_cancelled_request_nobody_streams_ends_on_the_engine(redis_client: Redis, keys: Keys) -> None:
    async def cancel(q: QueueStore, engine: SimulatedEngine) -> None:
        async def running() -> bool:
            return engine.running() == 1 and engine.steps > 3

        await _until(running)
        assert await q.cancel(ENGINE, "whole-100000") == "running"

    evs = await _one_whole_request_ended(redis_client, keys, cancel, lease_s=1.5)
    assert [e["t"] for e in evs] == ["final"] and evs[0]["finish_reason"] == "cancelled"


async def test_a_request_nobody_streams_past_max_run_ends_on_the_engine(
    redis_client: Redis, keys: Keys
) -> None:
    async def wait(q: QueueStore, engine: SimulatedEngine) -> None:
        return None  # max_run_s ends it

    evs = await _one_whole_request_ended(redis_client, keys, wait, max_run_s=0.5)
    assert [e["t"] for e in evs] == ["error"] and evs[0]["code"] == "DEADLINE_EXCEEDED"


async def test_shutdown_past_grace_abandons_to_the_next_worker(redis_client: Redis, keys: Keys) -> None:
    q = QueueStore(redis_client, keys)
    await _enqueue(q, "slow-100000", 1.0)
    first = _worker(redis_client, keys, _engine(1, 5.0), grace_s=0.2, lease_s=0.6)
    run = asyncio.create_task(first.run())
    await _until(lambda: _streaming(redis_client, keys, "slow-100000"))
    first.request_stop()
    await asyncio.wait_for(run, 5)
    assert not await _finished(redis_client, keys, "slow-100000")
    assert await redis_client.zscore(keys.claims(ENGINE), "slow-100000") is not None  # left to expire
    await asyncio.sleep(0.7)
    second_engine = _engine(1, 5.0)
    second = _worker(redis_client, keys, second_engine, lease_s=0.6)
    run = asyncio.create_task(second.run())
    try:
        await _until(lambda: _attempt_streaming(redis_client, keys, "slow-100000", 2), 5)
        await q.cancel(ENGINE, "slow-100000")
        await _until(lambda: _finished(redis_client, keys, "slow-100000"), 5)
    finally:
        second.request_stop()
        await asyncio.wait_for(run, 10)
    finals = [e for e in await _events(redis_client, keys, "slow-100000") if e["t"] == "final"]
    assert len(finals) == 1 and finals[0]["attempt"] == 2 and finals[0]["finish_reason"] == "cancelled"
    assert await _load(redis_client, keys) == 0


async def _attempt_streaming(r: Redis, keys: Keys, rid: str, attempt: int) -> bool:
    return any(e["t"] == "delta" and e["a"] == attempt for e in await _events(r, keys, rid))


class RefusingEngine(SimulatedEngine):
    """A fake engine (a simulated one) that refuses every request as too long, as vLLM does."""

    def generate(self, request: StageRequest, key: str, priority: int):  # type: ignore[no-untyped-def]
        raise EngineRequestError(f"{request.request_id}: prompt longer than the context")


async def test_a_refused_request_is_invalid_argument_and_frees_its_load(
    redis_client: Redis, keys: Keys
) -> None:
    q = QueueStore(redis_client, keys)
    await _enqueue(q, "z-5", 1.0)
    engine = RefusingEngine("sim", measured_style_profile(), 4, 50.0, FixedLengths())
    worker = _worker(redis_client, keys, engine, burst=True)
    await asyncio.wait_for(worker.run(), 10)
    last = (await _events(redis_client, keys, "z-5"))[-1]
    assert last["t"] == "error" and last["code"] == "INVALID_ARGUMENT"
    assert await _load(redis_client, keys) == 0
