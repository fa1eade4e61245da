"""The SDK given several dispatcher addresses: a stream whose dispatcher goes away mid-answer is retried
on another one with the same request id, and the caller sees each piece of text once. In-process gRPC
servers that play two dispatcher replicas sharing one request table (no Redis, no services)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from chimera.dispatcher.v1 import dispatcher_pb2_grpc
from services.sdk.client import AsyncClient, Client
from services.sdk.retry import RetryPolicy
from services.sdk.types import Completion, TextDelta

pytestmark = pytest.mark.unit

TEXT = ("hel", "lo ", "world")
FAST = RetryPolicy(budget_s=10.0, default_wait_s=0.05)


class Replica(dispatcher_pb2_grpc.DispatcherServicer):  # type: ignore[misc]
    """Streams TEXT for any request id from its first piece (a re-attach replays from the start); a
    replica that ``dies_after`` pieces stops answering there, as a killed process would."""

    def __init__(self, name: str, dies_after: int | None = None) -> None:
        self.name = name
        self.dies_after = dies_after
        self.seen: list[str] = []
        self.dying = asyncio.Event()

    async def Generate(  # noqa: N802 - the gRPC method's name
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[pb.GenerateResponse]:
        self.seen.append(request.request_id)
        for i, piece in enumerate(TEXT):
            if self.dies_after is not None and i == self.dies_after:
                self.dying.set()
                await asyncio.Event().wait()  # hangs until its server is torn down
            yield pb.GenerateResponse(delta=pb.TextDelta(text=piece, attempt=1))
        final = pb.Completion(request_id=request.request_id, text="".join(TEXT), engine=self.name, attempts=1)
        yield pb.GenerateResponse(final=final)


async def _serve(replica: Replica) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    dispatcher_pb2_grpc.add_DispatcherServicer_to_server(replica, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def test_a_stream_whose_dispatcher_dies_is_finished_by_the_other_one() -> None:
    a, b = Replica("a", dies_after=2), Replica("b")
    (sa, addr_a), (sb, addr_b) = await _serve(a), await _serve(b)
    events: list[TextDelta | Completion] = []
    try:
        async with AsyncClient([addr_a, addr_b], retry=FAST) as client:

            async def consume() -> None:
                # Round robin: the first call may go either way; keep calling until one lands on a.
                for n in range(8):
                    events.clear()
                    async for ev in client.stream(
                        "q", program_id="p", stage=0, workflow="w", request_id=f"r{n}"
                    ):
                        events.append(ev)
                    if a.seen:
                        return

            task = asyncio.create_task(consume())
            await asyncio.wait_for(a.dying.wait(), 10)
            await sa.stop(None)  # the replica dies with the stream open
            await asyncio.wait_for(task, 10)
    finally:
        await sb.stop(None)
    rid = a.seen[-1]
    assert b.seen[-1] == rid  # the retry went to the live replica with the same request id
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert "".join(deltas) == "".join(TEXT)  # the replayed pieces are not handed out twice
    final = events[-1]
    assert isinstance(final, Completion) and final.engine == "b" and final.request_id == rid


async def test_a_dead_address_among_several_does_not_fail_new_calls() -> None:
    b = Replica("b")
    sb, addr_b = await _serve(b)
    sa, addr_a = await _serve(Replica("a"))
    await sa.stop(None)  # nothing listens there any more
    try:
        async with AsyncClient([addr_a, addr_b], retry=FAST) as client:
            done = [
                await client.generate("q", program_id="p", stage=0, workflow="w", request_id=f"n{i}")
                for i in range(4)
            ]
    finally:
        await sb.stop(None)
    assert {c.engine for c in done} == {"b"} and all(c.text == "".join(TEXT) for c in done)


async def test_the_blocking_client_fails_over_too() -> None:
    b = Replica("b")
    sb, addr_b = await _serve(b)
    sa, addr_a = await _serve(Replica("a"))
    await sa.stop(None)
    try:

        def run() -> list[Completion]:
            with Client([addr_a, addr_b], retry=FAST) as client:
                return [
                    client.generate("q", program_id="p", stage=0, workflow="w", request_id=f"s{i}")
                    for i in range(3)
                ]

        done = await asyncio.to_thread(run)
    finally:
        await sb.stop(None)
    assert [c.engine for c in done] == ["b"] * 3


class FlakyEnd(dispatcher_pb2_grpc.DispatcherServicer):  # type: ignore[misc]
    """Answers EndProgram with UNAVAILABLE ``failures`` times (a dispatcher going away), then ends it."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def EndProgram(  # noqa: N802 - the gRPC method's name
        self, request: pb.EndProgramRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.EndProgramResponse:
        self.calls += 1
        if self.calls <= self.failures:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "dispatcher restarting")
        return pb.EndProgramResponse(found=True)


async def test_end_program_is_retried_through_unavailable() -> None:
    """A workflow's EndProgram that lands on a dying dispatcher is sent again, not lost with its outcome."""
    flaky = FlakyEnd(failures=2)
    server = grpc.aio.server()
    dispatcher_pb2_grpc.add_DispatcherServicer_to_server(flaky, server)
    addr = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    try:
        async with AsyncClient(addr, retry=FAST) as client:
            end = await client.end_program("p", outcome=1.0)
        assert end.found and flaky.calls == 3
        flaky.calls = 0
        with Client(addr, retry=FAST) as blocking:
            end = await asyncio.to_thread(blocking.end_program, "p", 0.5)
        assert end.found and flaky.calls == 3
    finally:
        await server.stop(None)
