"""The queue scripts against a real redis-server: dispatch, claim, lease, completion, cancel, reap."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from redis.asyncio import Redis

from services.common.chat import ToolCall, ToolCallPiece, piece_chars
from services.common.keys import Keys
from services.common.queue import DeltaItem, QueueStore
from services.common.queue_records import OutputEvent, Retention
from services.common.types import (
    ChatMessage,
    Prediction,
    SamplingParams,
    StageRequest,
    StageResult,
)

pytestmark = pytest.mark.redis


def _req(rid: str, program: str = "p1", stage: int = 0) -> StageRequest:
    return StageRequest(
        request_id=rid,
        program_id=program,
        stage=stage,
        workflow="code/coder",
        messages=(ChatMessage("user", f"task {rid}"),),
        sampling=SamplingParams(max_tokens=16),
    )


async def _load(r: Redis, keys: Keys, engine: str) -> int:
    return int(await r.hget(keys.engine_info(engine), "load") or 0)


async def _events(q: QueueStore, rid: str) -> list[OutputEvent]:
    return (await q.read_many({("e0", rid): "0"})).get(("e0", rid), [])


async def _assign(q: QueueStore, *args: Any) -> tuple[str, str, str]:
    _, assignment = await q.assign(*args)
    return assignment


async def test_enqueue_claim_complete_round_trip(redis_client: Redis, keys: Keys) -> None:
    q = QueueStore(redis_client, keys)
    for rid, y in [("a", 300), ("b", 100), ("c", 200)]:
        assert await q.enqueue("e0", _req(rid), Prediction(y, 2 * y), float(y), time.time(), {"why": rid})
    assert await _load(redis_client, keys, "e0") == 600
    assert not await q.enqueue("e0", _req("a"), Prediction(1, 1), 1.0, time.time(), {})
    assert await _load(redis_client, keys, "e0") == 600

    claimed = await q.claim("e0", "w1", 2, lease_s=5)
    assert [c.request.request_id for c in claimed] == ["b", "c"]
    assert claimed[0].attempt == 1 and claimed[0].predicted == 100
    res = StageResult("hi", "stop", 3, 2)
    assert await q.complete(claimed[0], res, None)
    assert not await q.complete(claimed[0], res, None)  # already finished: nothing written twice
    assert await _load(redis_client, keys, "e0") == 500
    events = await _events(q, "b")
    assert [e.data["t"] for e in events] == ["final"]
    assert events[0].data["text"] == "hi"


async def test_expired_lease_is_requeued_and_stale_worker_fenced(redis_client: Redis, keys: Keys) -> None:
    q = QueueStore(redis_client, keys, Retention(max_attempts=3))
    await q.enqueue("e0", _req("a"), Prediction(10, 20), 10.0, time.time(), {})
    first = (await q.claim("e0", "w1", 1, lease_s=0.05))[0]
    await asyncio.sleep(0.1)
    assert await q.reap("e0") == ["a"]
    second = (await q.claim("e0", "w2", 1, lease_s=5))[0]
    assert second.attempt == 2
    renewed = await q.renew("e0", {"a": first.attempt}, 5)
    assert renewed.lost == {"a"}
    assert not await q.complete(first, StageResult("stale", "stop", 1, 1), None)
    assert await q.complete(second, StageResult("fresh", "stop", 1, 1), None)
    assert await _load(redis_client, keys, "e0") == 0
    finals = [e.data for e in await _events(q, "a") if e.data["t"] == "final"]
    assert [f["text"] for f in finals] == ["fresh"]


async def test_cancel_queued_and_running(redis_client: Redis, keys: Keys) -> None:
    q = QueueStore(redis_client, keys)
    await q.enqueue("e0", _req("a"), Prediction(10, 20), 10.0, time.time(), {})
    await q.enqueue("e0", _req("b"), Prediction(20, 20), 20.0, time.time(), {})
    running = (await q.claim("e0", "w1", 1, lease_s=5))[0]
    assert await q.cancel("e0", "b") == "queued"
    assert await redis_client.zcard(keys.queue("e0")) == 0
    assert await q.cancel("e0", "a") == "running"
    renewed = await q.renew("e0", {"a": running.attempt}, 5)
    assert renewed.cancelled == {"a"}
    assert await q.complete(running, StageResult("", "cancelled", 1, 0), None)
    assert await _load(redis_client, keys, "e0") == 0
    assert await q.cancel("e0", "zzz") == "missing"


async def test_poison_request_fails_after_max_attempts(redis_client: Redis, keys: Keys) -> None:
    q = QueueStore(redis_client, keys, Retention(max_attempts=2))
    await q.enqueue("e0", _req("a"), Prediction(10, 20), 10.0, time.time(), {})
    for i in range(2):  # two distinct workers die running it (one worker cannot charge it twice)
        await q.claim("e0", f"w{i}", 1, lease_s=0.01)
        await asyncio.sleep(0.03)
        await q.reap("e0")
    fields = await q.request_fields("e0", "a")
    assert fields["state"] == "failed"
    assert await _load(redis_client, keys, "e0") == 0
    events = await _events(q, "a")
    assert events[-1].data["t"] == "error"


async def test_assign_is_sticky_and_rejects_backwards_stages(redis_client: Redis, keys: Keys) -> None:
    q = QueueStore(redis_client, keys)
    assert await _assign(q, "p", "e1", "m1", "wf", 0, "r0", 60, {"m1": 0.5}) == ("new", "e1", "m1")
    assert await _assign(q, "p", "e2", "m2", "wf", 1, "r1", 60, {}) == ("ok", "e1", "m1")
    assert (await _assign(q, "p", "e1", "m1", "wf", 0, "r2", 60, {}))[0] == "backwards"


async def test_credit_adds_to_a_live_program_and_never_revives_an_ended_one(
    redis_client: Redis, keys: Keys
) -> None:
    q = QueueStore(redis_client, keys)
    assert await q.credit_program("gone", 50) == 0
    assert not await redis_client.exists(keys.program("gone"))
    await _assign(q, "p", "e1", "m1", "wf", 0, "r0", 60, {})
    assert await q.credit_program("p", 30) == 30
    assert await q.credit_program("p", 12) == 42
    assert await redis_client.hget(keys.program("p"), "last_output") == "12"
    assert await redis_client.ttl(keys.program("p")) > 0  # the TTL the assign script set is kept


async def test_completion_credits_its_program_in_the_same_step(redis_client: Redis, keys: Keys) -> None:
    """On a single Redis COMPLETE adds the stage's output tokens to the program's attained service itself, so
    the count is there once the final event is; only the attempt that completed counts, and an ended program
    stays ended."""
    q = QueueStore(redis_client, keys)
    await _assign(q, "p1", "e0", "m1", "wf", 0, "a", 60, {})
    await q.enqueue("e0", _req("a"), Prediction(10, 20), 10.0, time.time(), {})
    claimed = (await q.claim("e0", "w1", 1, lease_s=5))[0]
    assert await q.complete(claimed, StageResult("hi", "stop", 3, 7), None)
    assert await redis_client.hget(keys.program("p1"), "attained") == "7"
    assert await redis_client.hget(keys.program("p1"), "last_output") == "7"  # an open loop's feature
    assert not await q.complete(claimed, StageResult("hi", "stop", 3, 7), None)  # fenced: no second credit
    assert await redis_client.hget(keys.program("p1"), "attained") == "7"
    await q.enqueue("e0", _req("b", program="ended"), Prediction(10, 20), 10.0, time.time(), {})
    claimed = (await q.claim("e0", "w1", 1, lease_s=5))[0]
    assert await q.complete(claimed, StageResult("hi", "stop", 3, 5), None)
    assert not await redis_client.exists(keys.program("ended"))


async def test_a_claim_that_empties_the_queue_silences_the_doorbell(redis_client: Redis, keys: Keys) -> None:
    """The doorbell announces queued work: a claim that takes the last request clears it, so the worker's
    next wait blocks until a new request rings instead of waking to claim nothing; a claim that leaves
    work behind keeps it."""
    q = QueueStore(redis_client, keys)
    for rid in ("a", "b", "c"):
        await q.enqueue("e0", _req(rid), Prediction(10, 20), 10.0, time.time(), {})
    assert await redis_client.llen(keys.wake("e0")) == 1
    assert len(await q.claim("e0", "w1", 2, lease_s=5)) == 2
    assert await redis_client.llen(keys.wake("e0")) == 1  # "c" still waits
    assert len(await q.claim("e0", "w1", 2, lease_s=5)) == 1
    assert not await redis_client.exists(keys.wake("e0"))
    await q.enqueue("e0", _req("d"), Prediction(10, 20), 10.0, time.time(), {})
    assert await redis_client.llen(keys.wake("e0")) == 1  # a new request rings again


async def test_a_pipeline_whose_redis_lost_its_scripts_runs_them_again(
    redis_client: Redis, keys: Keys
) -> None:
    """A Redis restart empties the script cache: the pipelined EVALSHAs answer NOSCRIPT, and the store loads
    the scripts and runs the pipeline again instead of failing."""
    q = QueueStore(redis_client, keys)
    await redis_client.script_flush()
    duplicate, (status, engine, _) = await q.assign("p-noscript", "e0", "m", "wf", 0, "r1", 60, {})
    assert not duplicate and (status, engine) == ("new", "e0")
    await redis_client.script_flush()
    assert await q.publish_deltas("e0", [("r1", 1, "x", 1)]) == [False]  # not running: fenced, not an error


async def test_a_completion_writes_its_last_deltas_ahead_of_the_final_event(
    redis_client: Redis, keys: Keys
) -> None:
    """The worker's last deltas ride in the completion's round trip: they land before the final event, the
    program is credited once, and a stale attempt's completion writes neither (even with NOSCRIPT)."""
    q = QueueStore(redis_client, keys)
    await _assign(q, "p-last", "e0", "m", "wf", 0, "last", 60, {})
    await q.enqueue("e0", _req("last", program="p-last"), Prediction(10, 20), 10.0, time.time(), {})
    (c,) = await q.claim("e0", "w1", 1, lease_s=5)
    assert await q.publish_deltas("e0", [("last", 1, "he", 2)]) == [True]
    await redis_client.script_flush()
    assert await q.complete(c, StageResult("hello", "stop", 3, 4), None, deltas=[("last", 1, "llo", 5)])
    events = await _events(q, "last")
    assert [(e.data["t"], e.data.get("text")) for e in events] == [
        ("delta", "he"),
        ("delta", "llo"),
        ("final", "hello"),
    ]
    assert await redis_client.hget(keys.program("p-last"), "attained") == "4"
    # A second completion of the same attempt (a retry whose reply was lost) changes nothing.
    assert not await q.complete(c, StageResult("hello", "stop", 3, 4), None, deltas=[("last", 1, "x", 6)])
    assert len(await _events(q, "last")) == 3
    assert await redis_client.hget(keys.program("p-last"), "attained") == "4"


async def test_one_flush_is_one_call_and_one_notify_entry_for_many_requests(
    redis_client: Redis, keys: Keys
) -> None:
    """A worker's flush: each running attempt's delta lands in its own stream, a stale attempt's and a
    retried one's are fenced, and the notify stream gets one entry listing the deltas written."""
    q = QueueStore(redis_client, keys)
    for rid in ("a", 'b"q', "c"):
        await q.enqueue("e0", _req(rid), Prediction(10, 20), 10.0, time.time(), {})
    claimed = {c.request.request_id: c for c in await q.claim("e0", "w1", 3, lease_s=5)}
    await redis_client.delete(keys.notify("e0"))
    items = [("a", 1, "x", 1), ('b"q', 1, "yz", 2), ("c", 2, "stale", 5)]
    assert all(c.attempt == 1 for c in claimed.values())
    assert await q.publish_deltas("e0", items) == [True, True, False]
    assert await q.publish_deltas("e0", [("a", 1, "x", 1)]) == [False]  # a retried write: already in
    assert [e.data["text"] for e in await _events(q, "a")] == ["x"]
    assert await _events(q, "c") == []
    (_, fields), *more = await redis_client.xrange(keys.notify("e0"))
    assert not more
    notes = json.loads(fields["m"])
    assert [(rid, ev["text"]) for rid, _, ev in notes] == [("a", "x"), ('b"q', "yz")]
    assert notes[1][1] == (await _events(q, 'b"q'))[0].stream_id


async def test_tool_call_pieces_and_calls_travel_in_the_output_events(
    redis_client: Redis, keys: Keys
) -> None:
    """A delta that carries only tool-call pieces still moves the attempt's position (so it is written), and
    the final event carries the whole calls."""
    q = QueueStore(redis_client, keys)
    await q.enqueue("e0", _req("tc"), Prediction(10, 20), 10.0, time.time(), {})
    (c,) = await q.claim("e0", "w1", 1, lease_s=5)
    piece = ToolCallPiece(0, "c1", "add", '{"a": 1}')
    assert await q.publish_deltas("e0", [DeltaItem("tc", 1, "", piece_chars(piece), (piece,))]) == [True]
    call = ToolCall("c1", "add", '{"a": 1}')
    assert await q.complete(c, StageResult("", "tool_calls", 3, 4, (call,)), None)
    delta, final = [e.data for e in await _events(q, "tc")]
    assert delta["tc"] == [piece.wire()] and delta["text"] == ""
    assert final["tool_calls"] == [{"id": "c1", "name": "add", "arguments": '{"a": 1}'}]
    assert final["finish_reason"] == "tool_calls"
