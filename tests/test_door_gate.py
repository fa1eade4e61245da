"""A full front door answers "busy, come back later" on both doors, never a transport's bare refusal.

Past a door's gate a call gets gRPC RESOURCE_EXHAUSTED with a ``retry-after`` trailer (the SDK retries it;
gRPC core's own "Concurrent RPC limit exceeded!" carries none and is read as "too large"), and an HTTP
request gets 429 with Retry-After in OpenAI's error shape (uvicorn's own limit answers 503). The real
dispatcher runs in process with a door limit of 2 (``max_open_requests`` 1, ``door_headroom`` 1), against
the fake workers of ``dispatcher_fakes``, which hold a request that says "hold" until it is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc
import httpx
import pytest
from dispatcher_fakes import dispatcher_server, fake_dependencies, fake_workers, register_engines
from grpc_health.v1 import health_pb2, health_pb2_grpc
from redis.asyncio import Redis

from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from chimera.dispatcher.v1 import dispatcher_pb2_grpc
from services.common.keys import Keys
from services.common.queue import QueueStore
from services.common.redis_proc import PrivateRedis
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.door import OPEN_RETRY_S, DoorGate, backstop
from services.dispatcher.errors import Overloaded
from services.dispatcher.http_api import HttpServer, OpenAIFrontDoor
from services.dispatcher.server import DispatcherServer

LIMIT = 2


# --- the gate ------------------------------------------------------------------------------------------


@pytest.mark.unit
def test_the_gate_refuses_past_its_limit_and_counts_nothing_for_a_refusal() -> None:
    gate = DoorGate(2)
    with gate.held(), gate.held():
        assert gate.open == 2
        with pytest.raises(Overloaded) as refused, gate.held():
            pass
        assert refused.value.code == "RESOURCE_EXHAUSTED"
        assert refused.value.retry_after_s == OPEN_RETRY_S and refused.value.retry_after == "1"
        assert gate.open == 2
    assert gate.open == 0
    with gate.held():  # room again
        assert gate.open == 1


@pytest.mark.unit
def test_the_gate_gives_its_place_back_however_the_block_ends() -> None:
    gate = DoorGate(1)
    with pytest.raises(RuntimeError), gate.held():
        raise RuntimeError("the call failed")
    assert gate.open == 0

    async def held_forever() -> None:
        with gate.held():
            await asyncio.Event().wait()

    async def cancelled() -> None:
        task = asyncio.create_task(held_forever())
        await asyncio.sleep(0)
        assert gate.open == 1
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    assert gate.open == 0


@pytest.mark.unit
def test_the_gate_needs_a_limit_and_the_backstop_stands_above_it() -> None:
    with pytest.raises(ValueError):
        DoorGate(0)
    assert all(backstop(n) > n for n in (1, 2, 12_500))


@pytest.mark.unit
def test_door_limit_keeps_its_default_headroom_unless_set() -> None:
    assert DispatcherSettings(max_open_requests=10_000).door_limit() == 12_500
    assert DispatcherSettings(max_open_requests=100).door_limit() == 356  # the floor of 256
    assert DispatcherSettings(max_open_requests=1, door_headroom=1).door_limit() == 2


# --- both doors, real ------------------------------------------------------------------------------------


@dataclass
class Doors:
    grpc: DispatcherServer
    http: OpenAIFrontDoor
    grpc_addr: str
    http_base: str
    redis: Redis
    keys: Keys

    async def known(self, program: str) -> None:
        """Wait until ``program``'s first stage is dispatched, so that its next one is a later stage."""
        deadline = time.monotonic() + 10
        while not await self.redis.exists(self.keys.program(program)):
            assert time.monotonic() < deadline, f"program {program} never appeared"
            await asyncio.sleep(0.02)


@pytest.fixture
async def doors(private_redis: PrivateRedis, keys: Keys, redis_client: Redis) -> AsyncIterator[Doors]:
    await register_engines(redis_client, keys)
    async with (
        fake_workers(QueueStore(redis_client, keys)),
        fake_dependencies(private_redis, keys) as settings,
    ):
        small = settings.model_copy(update={"max_open_requests": 1, "door_headroom": 1})
        assert small.door_limit() == LIMIT
        async with dispatcher_server(small, redis_client, keys) as grpc_server:
            front = OpenAIFrontDoor(grpc_server.dispatcher)
            http = HttpServer(front.app(), "127.0.0.1", 0, 1.0, limit=backstop(LIMIT))
            port = await http.start()
            try:
                grpc_addr, http_base = f"127.0.0.1:{grpc_server.port}", f"http://127.0.0.1:{port}"
                yield Doors(grpc_server, front, grpc_addr, http_base, redis_client, keys)
            finally:
                await http.stop()


async def _until(what: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.02)


def _held(program: str, stage: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        program_id=program,
        stage=stage,
        workflow="code/coder",
        messages=[pb.ChatMessage(role="user", content="hold this")],
    )


@pytest.mark.redis
@pytest.mark.timeout(60)
async def test_a_full_grpc_door_answers_resource_exhausted_with_retry_after(doors: Doors) -> None:
    gate = doors.grpc.gate
    async with grpc.aio.insecure_channel(doors.grpc_addr) as channel:
        stub = dispatcher_pb2_grpc.DispatcherStub(channel)
        # One new workflow (max_open_requests lets in no second) and its next stage, which is let in:
        # how a busy dispatcher's open calls outgrow max_open_requests.
        streams = [stub.Generate(_held("p0", 0))]
        await doors.known("p0")
        streams.append(stub.Generate(_held("p0", 1)))
        await _until(lambda: gate.open == LIMIT)

        calls: tuple[Callable[[], Awaitable[object]], ...] = (
            lambda: stub.Generate(_held("p0", 2), timeout=10).read(),
            lambda: stub.EndProgram(pb.EndProgramRequest(program_id="p0"), timeout=10),
            lambda: stub.ListModels(pb.ListModelsRequest(), timeout=10),
        )
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call()
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "open calls" in (refused.value.details() or "")
            assert ("retry-after", "1") in tuple(refused.value.trailing_metadata() or ())
        health = health_pb2_grpc.HealthStub(channel)
        ok = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert ok.status == health_pb2.HealthCheckResponse.SERVING  # the probe never meets the gate

        # A client that cancels mid-stream gives its place back, and the next call gets in.
        streams[0].cancel()
        await _until(lambda: gate.open == LIMIT - 1)
        models = await stub.ListModels(pb.ListModelsRequest(), timeout=10)
        assert {m.name for m in models.models} == {"m-small", "m-big"}
        streams[1].cancel()
        await _until(lambda: gate.open == 0)


@pytest.mark.redis
@pytest.mark.timeout(60)
async def test_a_full_http_door_answers_429_with_retry_after(doors: Doors) -> None:
    gate = doors.http.gate
    hold = {"model": "auto", "messages": [{"role": "user", "content": "hold this"}]}
    async with (
        contextlib.AsyncExitStack() as opened,
        httpx.AsyncClient(base_url=doors.http_base, timeout=20) as client,
    ):
        # A workflow's first stage streamed and its next stage plain, both held by their engine until they
        # are cancelled (max_open_requests lets in no second new workflow, but a later stage always).
        stage = {"X-Chimera-Program-Id": "h0", "X-Chimera-Stage": "0"}
        streamed = await opened.enter_async_context(
            client.stream("POST", "/v1/chat/completions", json={**hold, "stream": True}, headers=stage)
        )
        assert streamed.status_code == 200
        await doors.known("h0")
        next_stage = {**stage, "X-Chimera-Stage": "1"}
        plain = asyncio.create_task(client.post("/v1/chat/completions", json=hold, headers=next_stage))
        await _until(lambda: gate.open == LIMIT)

        for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models")):
            refused = await client.request(method, path, json=hold if method == "POST" else None)
            assert refused.status_code == 429, refused.text
            assert refused.headers["retry-after"] == "1"
            assert refused.headers["x-should-retry"] == "true"
            error = refused.json()["error"]
            assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
            assert "open calls" in error["message"]
        assert (await client.get("/health")).status_code == 200  # the probe never meets the gate
        assert gate.open == LIMIT

        # A client that goes away mid-stream gives its place back, and the next request gets in.
        await opened.aclose()
        await _until(lambda: gate.open == LIMIT - 1)
        models = await client.get("/v1/models")
        assert models.status_code == 200
        plain.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await plain
        await _until(lambda: gate.open == 0)
