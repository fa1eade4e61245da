"""The real dispatcher gRPC server, in process, against fake router/predictor gRPC servers and a fake worker
(the fakes live in ``dispatcher_fakes``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
from dispatcher_fakes import dispatcher_server, fake_dependencies, fake_workers, register_engines
from redis.asyncio import Redis

from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from chimera.dispatcher.v1 import dispatcher_pb2_grpc
from services.common.keys import Keys
from services.common.queue import QueueStore
from services.common.redis_proc import PrivateRedis
from services.dispatcher.config import DispatcherSettings

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


@dataclass
class Stack:
    stub: dispatcher_pb2_grpc.DispatcherStub
    redis: Redis
    keys: Keys
    store: QueueStore
    settings: DispatcherSettings
    addr: str


@contextlib.asynccontextmanager
async def _dispatcher(settings: DispatcherSettings, redis: Redis, keys: Keys) -> AsyncIterator[str]:
    async with dispatcher_server(settings, redis, keys) as server:
        yield f"127.0.0.1:{server.port}"


@pytest.fixture
async def stack(private_redis: PrivateRedis, keys: Keys, redis_client: Redis) -> AsyncIterator[Stack]:
    await register_engines(redis_client, keys)
    store = QueueStore(redis_client, keys)
    async with (
        fake_workers(store),
        fake_dependencies(private_redis, keys) as settings,
        _dispatcher(settings, redis_client, keys) as addr,
        grpc.aio.insecure_channel(addr) as ch,
    ):
        yield Stack(dispatcher_pb2_grpc.DispatcherStub(ch), redis_client, keys, store, settings, addr)


def _gen(
    program: str = "p1", stage: int = 0, text: str = "write a haiku", **kw: object
) -> pb.GenerateRequest:
    req = pb.GenerateRequest(
        program_id=program,
        stage=stage,
        workflow="code/coder",
        messages=[
            pb.ChatMessage(role="system", content="be brief"),
            pb.ChatMessage(role="user", content=text),
        ],
        sampling=pb.SamplingParams(max_tokens=32),
    )
    for name, value in kw.items():
        setattr(req, name, value)
    return req


async def _collect(
    stub: dispatcher_pb2_grpc.DispatcherStub, req: pb.GenerateRequest
) -> list[pb.GenerateResponse]:
    return [r async for r in stub.Generate(req, timeout=20)]


async def _code(stub: dispatcher_pb2_grpc.DispatcherStub, req: pb.GenerateRequest) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _collect(stub, req)
    return err.value.code()  # type: ignore[no-any-return]


async def _state_keys(r: Redis, keys: Keys) -> set[str]:
    """Every request and program key under this test's prefix."""
    found = {k async for k in r.scan_iter(match=f"{keys.prefix}:*", count=500)}
    return {k for k in found if ":req:" in k or ":prog:" in k}


async def _wait_state(s: Stack, engine: str, rid: str, state: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await s.redis.hget(s.keys.request(engine, rid), "state") == state:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{rid} never reached state {state}")


async def test_generate_streams_deltas_then_one_final(stack: Stack) -> None:
    out = await _collect(stack.stub, _gen(request_id="r-ok"))
    deltas = [r.delta for r in out if r.HasField("delta")]
    finals = [r.final for r in out if r.HasField("final")]
    # Deltas that reach the front door together go out as one message: the text, not the split, is kept.
    assert "".join(d.text for d in deltas) == "Hello" and all(d.attempt == 1 for d in deltas)
    assert len(finals) == 1 and out[-1].HasField("final")
    f = finals[0]
    # Idle pool: both engines have L = 0, so the more confident m-big passes slack and margin.
    assert (f.request_id, f.text, f.finish_reason, f.engine, f.model) == (
        "r-ok",
        "Hello",
        "stop",
        "e1",
        "m-big",
    )
    assert (f.usage.prompt_tokens, f.usage.completion_tokens, f.attempts) == (7, 2, 1)
    assert (f.predicted_tokens, f.predicted_tokens_p90) == (40, 80)
    assert f.dispatch_ms > 0 and f.e2e_s >= f.queue_wait_s >= 0
    # The Table 1 split: each part was spent; the router and the predictor run at once on a first stage, so
    # the longer of the two plus the rest fits in the whole.
    t = f.dispatch_timings
    assert min(t.router_ms, t.predictor_ms, t.policy_ms, t.redis_ms) > 0
    assert max(t.router_ms, t.predictor_ms) + t.policy_ms + t.redis_ms <= f.dispatch_ms
    fields = await stack.store.request_fields("e1", "r-ok")
    decision = json.loads(fields["decision"])
    assert decision["branch"] == "new" and decision["degraded"] == [] and decision["y"] == 40
    assert {c["engine"] for c in decision["selection"]["candidates"]} == {"e0", "e1"}
    # Stage 2 of the same program reuses the engine without asking the router.
    out = await _collect(stack.stub, _gen(stage=1, request_id="r-ok-2", text="fail-router if asked"))
    assert out[-1].final.engine == "e1"
    assert json.loads((await stack.store.request_fields("e1", "r-ok-2"))["decision"])["branch"] == "reuse"


def _no_program(r: pb.GenerateRequest) -> None:
    r.program_id = ""


def _no_messages(r: pb.GenerateRequest) -> None:
    del r.messages[:]


def _bad_role(r: pb.GenerateRequest) -> None:
    r.messages[0].role = "wizard"


def _no_workflow(r: pb.GenerateRequest) -> None:
    r.workflow = ""


def _too_many_tokens(r: pb.GenerateRequest) -> None:
    r.sampling.max_tokens = 513


def _huge_prompt(r: pb.GenerateRequest) -> None:
    r.messages[1].content = "x" * 2001


def _unknown_model(r: pb.GenerateRequest) -> None:
    r.model = "m-huge"


def _fifty_thousand_messages(r: pb.GenerateRequest) -> None:
    r.messages.extend(pb.ChatMessage(role="user", content="") for _ in range(50_000))


def _new_program_at_stage_7(r: pb.GenerateRequest) -> None:
    r.stage = 7  # over max_stage_skip (4) ahead of a new program's stage 0


def _huge_stage(r: pb.GenerateRequest) -> None:
    r.stage = 2**32 - 1


def _huge_workflow(r: pb.GenerateRequest) -> None:
    r.workflow = "w" * 100_000


def _workflow_with_space(r: pb.GenerateRequest) -> None:
    r.workflow = "code coder"


def _redis_key_program(r: pb.GenerateRequest) -> None:
    r.program_id = "chimera:{e0}:queue"


def _glob_request_id(r: pb.GenerateRequest) -> None:
    r.request_id = "r-*"


def _long_request_id(r: pb.GenerateRequest) -> None:
    r.request_id = "r" * 201


def _many_stops(r: pb.GenerateRequest) -> None:
    r.sampling.stop.extend(str(i) for i in range(17))


def _long_stop(r: pb.GenerateRequest) -> None:
    r.sampling.stop.append("s" * 257)


def _stops_over_the_prompt_limit(r: pb.GenerateRequest) -> None:
    r.sampling.stop.extend(f"{i:02d}" + "s" * 198 for i in range(10))  # 2,000 characters, plus the messages


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (_no_program, grpc.StatusCode.INVALID_ARGUMENT),
        (_no_messages, grpc.StatusCode.INVALID_ARGUMENT),
        (_bad_role, grpc.StatusCode.INVALID_ARGUMENT),
        (_no_workflow, grpc.StatusCode.INVALID_ARGUMENT),
        (_too_many_tokens, grpc.StatusCode.INVALID_ARGUMENT),
        (_huge_prompt, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (_unknown_model, grpc.StatusCode.NOT_FOUND),
        (_fifty_thousand_messages, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (_new_program_at_stage_7, grpc.StatusCode.INVALID_ARGUMENT),
        (_huge_stage, grpc.StatusCode.INVALID_ARGUMENT),
        (_huge_workflow, grpc.StatusCode.INVALID_ARGUMENT),
        (_workflow_with_space, grpc.StatusCode.INVALID_ARGUMENT),
        (_redis_key_program, grpc.StatusCode.INVALID_ARGUMENT),
        (_glob_request_id, grpc.StatusCode.INVALID_ARGUMENT),
        (_long_request_id, grpc.StatusCode.INVALID_ARGUMENT),
        (_many_stops, grpc.StatusCode.INVALID_ARGUMENT),
        (_long_stop, grpc.StatusCode.INVALID_ARGUMENT),
        (_stops_over_the_prompt_limit, grpc.StatusCode.RESOURCE_EXHAUSTED),
    ],
)
async def test_bad_input_is_refused_and_leaves_nothing(
    stack: Stack, mutate: object, code: grpc.StatusCode
) -> None:
    req = _gen(program="p-bad", request_id="r-bad")
    mutate(req)  # type: ignore[operator]
    assert await _code(stack.stub, req) == code
    assert await _state_keys(stack.redis, stack.keys) == set()


async def test_a_stage_may_skip_ahead_only_by_max_stage_skip(stack: Stack) -> None:
    await _collect(stack.stub, _gen(program="p-skip", stage=0, request_id="r-k0"))
    before = await _state_keys(stack.redis, stack.keys)
    skip = stack.settings.max_stage_skip
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _collect(stack.stub, _gen(program="p-skip", stage=2 + skip, request_id="r-k-far"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_stage_skip" in (err.value.details() or "")
    assert await _state_keys(stack.redis, stack.keys) == before
    assert await stack.redis.hget(stack.keys.program("p-skip"), "stage") == "0"
    out = await _collect(stack.stub, _gen(program="p-skip", stage=1 + skip, request_id="r-k-ok"))
    assert out[-1].final.text == "Hello"


async def test_undecodable_text_is_invalid_argument(stack: Stack) -> None:
    """A lone surrogate cannot be encoded by a client library, but its bytes (CESU-8) can be sent raw."""
    raw = _gen(program="p-utf", request_id="r-utf", text="AB").SerializeToString().replace(b"AB", b"\xed\xa0")
    async with grpc.aio.insecure_channel(stack.addr) as ch:
        call = ch.unary_stream("/chimera.dispatcher.v1.Dispatcher/Generate")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            _ = [r async for r in call(raw, timeout=10)]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert await _state_keys(stack.redis, stack.keys) == set()


async def test_backwards_stage_and_duplicate_id_change_nothing(stack: Stack) -> None:
    await _collect(stack.stub, _gen(program="p2", stage=2, request_id="r-s2"))
    before = await _state_keys(stack.redis, stack.keys)
    prog_before = await stack.redis.hgetall(stack.keys.program("p2"))
    assert (
        await _code(stack.stub, _gen(program="p2", stage=1, request_id="r-s1"))
        == grpc.StatusCode.FAILED_PRECONDITION
    )
    assert (
        await _code(stack.stub, _gen(program="p2", stage=3, request_id="r-s2"))
        == grpc.StatusCode.ALREADY_EXISTS
    )
    # A fresh program with a duplicate id: the program entry must not survive the refusal either.
    assert (
        await _code(stack.stub, _gen(program="p3", stage=0, request_id="r-s2"))
        == grpc.StatusCode.ALREADY_EXISTS
    )
    assert await _state_keys(stack.redis, stack.keys) == before
    after = await stack.redis.hgetall(stack.keys.program("p2"))
    assert {k: after[k] for k in ("engine", "stage", "request_id")} == {
        k: prog_before[k] for k in ("engine", "stage", "request_id")
    }


async def test_no_live_engine_is_unavailable(stack: Stack) -> None:
    await register_engines(stack.redis, stack.keys, heartbeat_ms=int((time.time() - 3600) * 1000))
    assert await _code(stack.stub, _gen(program="p-dead", request_id="r-dead")) == grpc.StatusCode.UNAVAILABLE
    assert await _state_keys(stack.redis, stack.keys) == set()


async def test_unreachable_redis_is_unavailable(stack: Stack, tmp_path: object) -> None:
    broken = Redis.from_url(f"unix://{tmp_path}/no-such.sock", decode_responses=True)
    settings = stack.settings.model_copy(update={"reaper_interval_s": 60.0})
    try:
        async with _dispatcher(settings, broken, stack.keys) as addr, grpc.aio.insecure_channel(addr) as ch:
            stub = dispatcher_pb2_grpc.DispatcherStub(ch)
            assert await _code(stub, _gen(program="p-x", request_id="r-x")) == grpc.StatusCode.UNAVAILABLE
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.ListModels(pb.ListModelsRequest(), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await broken.aclose()


async def test_dependency_failures_degrade_instead_of_failing(stack: Stack) -> None:
    out = await _collect(stack.stub, _gen(program="p-r", request_id="r-r", text="fail-router now"))
    # Without confidences every q is 0: nothing beats the margin, so the fastest (idle tie -> e0) serves.
    assert out[-1].final.engine == "e0"
    assert json.loads((await stack.store.request_fields("e0", "r-r"))["decision"])["degraded"] == ["router"]
    out = await _collect(stack.stub, _gen(program="p-p", request_id="r-p", text="fail-predictor now"))
    f = out[-1].final
    assert (f.predicted_tokens, f.predicted_tokens_p90) == (32, 32)  # max_tokens stands in
    assert json.loads((await stack.store.request_fields(f.engine, "r-p"))["decision"])["degraded"] == [
        "predictor"
    ]


async def test_end_program_cancels_records_outcome_and_forgets(stack: Stack) -> None:
    call = asyncio.create_task(
        _collect(stack.stub, _gen(program="p-end", request_id="r-hold", text="hold it"))
    )
    await _wait_state(stack, "e1", "r-hold", "running")
    resp = await stack.stub.EndProgram(pb.EndProgramRequest(program_id="p-end", outcome=0.75), timeout=10)
    assert (resp.found, resp.cancelled_requests) == (True, 1)
    out = await asyncio.wait_for(call, 15)
    assert out[-1].final.finish_reason == "cancelled"
    assert not await stack.redis.exists(stack.keys.program("p-end"))
    rows = await stack.redis.xrange(stack.keys.outcomes())
    row = json.loads(rows[-1][1]["row"])
    assert (row["program_id"], row["engine"], row["model"], row["outcome"]) == ("p-end", "e1", "m-big", 0.75)
    resp = await stack.stub.EndProgram(pb.EndProgramRequest(program_id="p-end"), timeout=10)
    assert (resp.found, resp.cancelled_requests) == (False, 0)


async def test_caller_going_away_cancels_the_request(stack: Stack) -> None:
    call = stack.stub.Generate(_gen(program="p-gone", request_id="r-gone", text="hold on"), timeout=20)
    reader = asyncio.create_task(call.read())
    await _wait_state(stack, "e1", "r-gone", "running")
    call.cancel()
    with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
        await reader
    await _wait_state(stack, "e1", "r-gone", "cancelled")
    assert int(await stack.redis.hget(stack.keys.engine_info("e1"), "load") or 0) == 0


async def test_a_retry_gets_the_same_answer_without_a_second_run(stack: Stack) -> None:
    req = _gen(program="p-again", request_id="r-again")
    first, again = await _collect(stack.stub, req), await _collect(stack.stub, req)
    assert [r.final.text for r in again if r.HasField("final")] == ["Hello"]
    # The replay merges deltas that were sent apart: the same text, in fewer messages.
    assert "".join(r.delta.text for r in again if r.HasField("delta")) == "".join(
        r.delta.text for r in first if r.HasField("delta")
    )
    assert await stack.redis.hget(stack.keys.request("e1", "r-again"), "attempt") == "1"


async def test_a_caller_that_comes_back_in_time_keeps_its_request(stack: Stack) -> None:
    req = _gen(program="p-back", request_id="r-back", text="hold on")
    call = stack.stub.Generate(req, timeout=20)
    reader = asyncio.create_task(call.read())
    await _wait_state(stack, "e1", "r-back", "running")
    call.cancel()  # the caller's connection breaks ...
    with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
        await reader
    retry = asyncio.create_task(_collect(stack.stub, req))  # ... and its retry re-attaches
    await asyncio.sleep(stack.settings.detach_grace_s + 1.0)
    state = await stack.redis.hget(stack.keys.request("e1", "r-back"), "state")
    assert state == "running", "the broken call's deferred cancel must spare a re-attached request"
    await stack.stub.EndProgram(pb.EndProgramRequest(program_id="p-back"), timeout=10)
    final = [r.final for r in await retry if r.HasField("final")]
    assert [f.finish_reason for f in final] == ["cancelled"]


async def test_a_later_stage_leaves_a_dead_engine_only_for_a_close_enough_model(stack: Stack) -> None:
    first = [r.final for r in await _collect(stack.stub, _gen(program="p-move")) if r.HasField("final")]
    assert first[0].engine == "e1"  # m-big: the confident model
    await stack.redis.hset(stack.keys.engine_info("e1"), "heartbeat_ms", 0)  # its worker is gone
    # m-small's confidence (0.2) is far below m-big's (0.9): no move, a clear refusal naming the engine.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _collect(stack.stub, _gen(program="p-move", stage=1))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "'e1'" in str(err.value.details())
    program = stack.keys.program("p-move")
    await stack.redis.hset(program, "confidences", json.dumps({"m-big": 0.9, "m-small": 0.85}))
    moved = [r.final for r in await _collect(stack.stub, _gen(program="p-move", stage=1, request_id="r-mv"))]
    assert moved[-1].engine == "e0"
    assert await stack.redis.hget(program, "engine") == "e0", "the program now lives on e0"
    decision = json.loads(await stack.redis.hget(stack.keys.request("e0", "r-mv"), "decision"))
    assert decision["moved"] == {"from": "e1", "to": "e0", "margin": stack.settings.brownout_margin}


async def test_timeout_ms_is_deadline_exceeded_and_cancels(stack: Stack) -> None:
    req = _gen(program="p-slow", request_id="r-slow", text="hold forever", timeout_ms=300)
    assert await _code(stack.stub, req) == grpc.StatusCode.DEADLINE_EXCEEDED
    await _wait_state(stack, "e1", "r-slow", "cancelled")


async def test_list_models(stack: Stack) -> None:
    resp = await stack.stub.ListModels(pb.ListModelsRequest(), timeout=10)
    assert [m.name for m in resp.models] == ["m-big", "m-small"]
    big = resp.models[0].engines[0]
    assert (big.engine_id, big.alive, big.decode_ms_per_token, big.max_batch_size) == ("e1", True, 20.0, 8)


async def test_pinned_model_skips_the_router_and_binds_the_program(stack: Stack) -> None:
    # "fail-router" would degrade the decision if the router were asked; a pin must not ask it.
    out = await _collect(
        stack.stub, _gen(program="p-pin", request_id="r-pin", text="fail-router", model="m-small")
    )
    assert (out[-1].final.engine, out[-1].final.model) == ("e0", "m-small")
    decision = json.loads((await stack.store.request_fields("e0", "r-pin"))["decision"])
    assert (decision["branch"], decision["degraded"]) == ("pinned", [])
    before = await _state_keys(stack.redis, stack.keys)
    req = _gen(program="p-pin", stage=1, request_id="r-pin-2", model="m-big")
    assert await _code(stack.stub, req) == grpc.StatusCode.FAILED_PRECONDITION
    assert await _state_keys(stack.redis, stack.keys) == before


async def test_mlfq_is_fed_the_programs_attained_service(
    private_redis: PrivateRedis, keys: Keys, redis_client: Redis
) -> None:
    """The front door credits each relayed stage's output tokens to its program, and a policy that orders by
    attained service (MLFQ) is fed that count instead of the predictor's ŷ."""
    await register_engines(redis_client, keys)
    store = QueueStore(redis_client, keys)
    async with (
        fake_workers(store),
        fake_dependencies(private_redis, keys) as settings,
        _dispatcher(settings.model_copy(update={"policy": "mlfq"}), redis_client, keys) as addr,
        grpc.aio.insecure_channel(addr) as ch,
    ):
        stub = dispatcher_pb2_grpc.DispatcherStub(ch)
        first = (await _collect(stub, _gen(program="pm", request_id="m-0")))[-1].final
        assert await redis_client.hget(keys.program("pm"), "attained") == str(first.usage.completion_tokens)
        second = (await _collect(stub, _gen(program="pm", stage=1, request_id="m-1")))[-1].final
        decision = json.loads((await store.request_fields(second.engine, "m-1"))["decision"])
        # 2 attained tokens sit in MLFQ's first level (floor 0): the score is the aging term alone, where the
        # predictor's 40 would have added 40.
        assert decision["y"] == 40
        assert decision["score"] == pytest.approx(decision["aging_rate"] * decision["t_enq"])
        assert await redis_client.hget(keys.program("pm"), "attained") == str(
            first.usage.completion_tokens + second.usage.completion_tokens
        )
        await stub.EndProgram(pb.EndProgramRequest(program_id="pm"))
        assert not await redis_client.exists(keys.program("pm"))
