"""How the SDK ends a stream and reads a refusal, against a bare gRPC server on loopback that stands in for
the dispatcher (a fake front door: only the wire behaviour is under test, not dispatching).

- A caller that stops reading right after the Completion must not reset a stream that succeeded: the
  server would count a finished request as cancelled.
- gRPC core's own concurrency refusal is "busy", so the SDK retries it; a size refusal is not retried.
- Refusals in a row wait longer each time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from chimera_client import NO_RETRY, AsyncClient, Client, RetryPolicy
from chimera_client.errors import OverloadedError, RequestTooLargeError, from_rpc_error

pytestmark = pytest.mark.timeout(30)
SERVICE = pb.DESCRIPTOR.services_by_name["Dispatcher"].full_name
STATUS_DELAY_S = 0.3  # the fake sends its status this long after the Completion


class FakeDoor:
    """Generate answers one delta and a Completion, then holds the status back for ``STATUS_DELAY_S``,
    recording whether the client cancelled in the meantime. ``refusals`` first: that many calls are
    refused with RESOURCE_EXHAUSTED and ``refusal_details``, no trailer."""

    def __init__(self, refusals: int = 0, refusal_details: str = "") -> None:
        self.cancelled: list[bool] = []
        self.calls = 0
        self.refusals = refusals
        self.refusal_details = refusal_details

    async def generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        self.calls += 1
        if self.calls <= self.refusals:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self.refusal_details)
        yield pb.GenerateResponse(delta=pb.TextDelta(text="Hello"))
        yield pb.GenerateResponse(final=pb.Completion(request_id=request.request_id, text="Hello"))
        await asyncio.sleep(STATUS_DELAY_S)
        self.cancelled.append(context.cancelled())


async def _serve(door: FakeDoor) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    handler = grpc.unary_stream_rpc_method_handler(
        door.generate,
        request_deserializer=pb.GenerateRequest.FromString,
        response_serializer=pb.GenerateResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Generate": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def test_a_caller_that_stops_at_the_completion_does_not_cancel_a_finished_stream() -> None:
    door = FakeDoor()
    server, addr = await _serve(door)
    try:
        async with AsyncClient(addr, retry=NO_RETRY) as client:
            async for ev in client.stream("hi", program_id="p", stage=0, workflow="code/coder"):
                if not hasattr(ev, "attempt"):  # the Completion: stop reading here, as a UI might
                    break
        await asyncio.sleep(STATUS_DELAY_S + 0.2)
        assert door.cancelled == [False]
    finally:
        await server.stop(None)


def test_the_blocking_client_does_not_cancel_a_finished_stream_either() -> None:
    async def scenario() -> list[bool]:
        door = FakeDoor()
        server, addr = await _serve(door)
        try:

            def call() -> None:
                with Client(addr, retry=NO_RETRY) as client:
                    for ev in client.stream("hi", program_id="p", stage=0, workflow="code/coder"):
                        if not hasattr(ev, "attempt"):
                            break

            await asyncio.to_thread(call)
            await asyncio.sleep(STATUS_DELAY_S + 0.2)
            return door.cancelled
        finally:
            await server.stop(None)

    assert asyncio.run(scenario()) == [False]


async def test_grpc_cores_concurrency_refusal_is_retried_as_busy() -> None:
    door = FakeDoor(refusals=2, refusal_details="Concurrent RPC limit exceeded!")
    server, addr = await _serve(door)
    try:
        policy = RetryPolicy(budget_s=10.0, default_wait_s=0.05, jitter=0.0)
        async with AsyncClient(addr, retry=policy) as client:
            done = await client.generate("hi", program_id="p", stage=0, workflow="code/coder")
        assert done.text == "Hello" and door.calls == 3
    finally:
        await server.stop(None)


async def test_a_size_refusal_is_not_retried() -> None:
    door = FakeDoor(refusals=5, refusal_details="the prompt is over the limit")
    server, addr = await _serve(door)
    try:
        policy = RetryPolicy(budget_s=10.0, default_wait_s=0.05)
        async with AsyncClient(addr, retry=policy) as client:
            with pytest.raises(RequestTooLargeError):
                await client.generate("hi", program_id="p", stage=0, workflow="code/coder")
        assert door.calls == 1
    finally:
        await server.stop(None)


def test_the_mapping_reads_cores_refusal_without_a_time() -> None:
    class Refused(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.RESOURCE_EXHAUSTED

        def details(self) -> str:
            return "Concurrent RPC limit exceeded!"

        def trailing_metadata(self) -> tuple[()]:
            return ()

    err = from_rpc_error(Refused())
    assert isinstance(err, OverloadedError) and err.retry_after_s is None


def test_refusals_in_a_row_wait_longer_each_time_up_to_the_cap() -> None:
    told = OverloadedError("RESOURCE_EXHAUSTED", "full", 0.5)
    silent = OverloadedError("RESOURCE_EXHAUSTED", "full", None)
    p = RetryPolicy(jitter=0.0, max_wait_s=3.0)
    assert [p.wait_s(told, n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert [p.wait_s(silent, n) for n in (1, 2, 3)] == [1.0, 2.0, 3.0]
    assert RetryPolicy(jitter=0.0, backoff=1.0).wait_s(told, 4) == 0.5  # growth off
