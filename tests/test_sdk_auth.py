"""The SDK sends its API key on every call as ``authorization: Bearer <key>`` metadata (the dispatcher's
auth contract), taken from the argument or else from ``CHIMERA_API_KEY``; without either it sends none."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from chimera.dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc
from services.sdk import AsyncClient, Client

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class _Recorder(pb_grpc.DispatcherServicer):
    """A dispatcher that answers every call and keeps the authorization header each one carried."""

    def __init__(self) -> None:
        self.seen: list[str | None] = []

    def _record(self, context: grpc.aio.ServicerContext[object, object]) -> None:
        found = [str(v) for k, v in context.invocation_metadata() or () if k == "authorization"]
        self.seen.append(found[0] if found else None)

    async def Generate(  # noqa: N802 (gRPC method name)
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[pb.GenerateResponse]:
        self._record(context)
        yield pb.GenerateResponse(final=pb.Completion(request_id=request.request_id, text="ok"))

    async def EndProgram(  # noqa: N802
        self, request: pb.EndProgramRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.EndProgramResponse:
        self._record(context)
        return pb.EndProgramResponse(found=True)

    async def ListModels(  # noqa: N802
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.ListModelsResponse:
        self._record(context)
        return pb.ListModelsResponse()


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[_Recorder, str]]:
    server = grpc.aio.server()
    rec = _Recorder()
    pb_grpc.add_DispatcherServicer_to_server(rec, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield rec, f"127.0.0.1:{port}"
    await server.stop(None)


@pytest.fixture
def no_env_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("CHIMERA_API_KEY", raising=False)
    yield


async def test_async_client_sends_the_key_on_every_call(
    recorder: tuple[_Recorder, str], no_env_key: None
) -> None:
    rec, addr = recorder
    async with AsyncClient(addr, api_key="k-123") as c:
        await c.generate("hi", program_id="p", stage=0, workflow="w")
        await c.end_program("p")
        await c.list_models()
    assert rec.seen == ["Bearer k-123"] * 3


async def test_the_key_falls_back_to_the_environment(
    recorder: tuple[_Recorder, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rec, addr = recorder
    monkeypatch.setenv("CHIMERA_API_KEY", "from-env")
    async with AsyncClient(addr) as c:
        await c.list_models()
    async with AsyncClient(addr, api_key="explicit") as c:
        await c.list_models()
    assert rec.seen == ["Bearer from-env", "Bearer explicit"]


async def test_no_key_sends_no_header(recorder: tuple[_Recorder, str], no_env_key: None) -> None:
    rec, addr = recorder
    async with AsyncClient(addr) as c:
        await c.list_models()
    assert rec.seen == [None]


async def test_blocking_client_sends_the_key(recorder: tuple[_Recorder, str], no_env_key: None) -> None:
    rec, addr = recorder

    def calls() -> None:
        with Client(addr, api_key="k-sync") as c:
            c.generate("hi", program_id="p", stage=0, workflow="w")
            c.end_program("p")
            c.list_models()

    # The blocking client must not run on the loop that serves the fake dispatcher.
    await asyncio.to_thread(calls)
    assert rec.seen == ["Bearer k-sync"] * 3
