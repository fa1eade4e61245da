"""A burst at the gRPC door is answered, never dropped, on a real dispatcher process (loopback).

The asyncio gRPC server picks up one call of a method at a time, as its loop turns; the rest wait inside
gRPC core, which by default drops new calls at random once more than 1,000 wait and every one past 3,000,
each ending CANCELLED "CANCELLED" at the client (nothing retries it). Refused clients coming back after the
same Retry-After make exactly such bursts: under 10x overload with the SDK's retries, 12-19% of calls ended
that way. The dispatcher lets that backlog grow to its hard stop (``grpc_server_options``).

The test freezes the dispatcher (SIGSTOP) while a burst of calls is sent, so that on SIGCONT gRPC core reads
them all at once, far faster than the loop picks them up.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections import Counter
from collections.abc import Iterator

import grpc
import pytest
from service_proc import Service, dispatcher_env

from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from chimera.dispatcher.v1 import dispatcher_pb2_grpc
from services.common.keys import Keys
from services.common.redis_proc import PrivateRedis
from services.dispatcher.server import grpc_server_options

pytestmark = pytest.mark.timeout(180)

_SERVING = re.compile(r"serving on \S+:(\d+) \((.+)\)")
BURST = 2500  # past gRPC core's default backlog of 1,000 (and close to its hard 3,000), below the door limit


@pytest.mark.unit
def test_the_backlog_bounds_are_the_door_limit() -> None:
    opts = dict(grpc_server_options(12_500))
    assert opts["grpc.server.max_pending_requests"] == 12_500
    assert opts["grpc.server.max_pending_requests_hard_limit"] == 12_500
    assert opts["grpc.server_max_unrequested_time_in_server"] > 30


@pytest.fixture
def dispatcher(private_redis: PrivateRedis, keys: Keys) -> Iterator[tuple[Service, str]]:
    d = Service("services.dispatcher", dispatcher_env(private_redis.url, keys.prefix, grace_s="1"))
    try:
        port = d.wait_for(_SERVING).group(1)
        yield d, f"127.0.0.1:{port}"
    finally:
        if d.proc.poll() is None:
            os.kill(d.proc.pid, signal.SIGCONT)
            d.proc.kill()
            d.proc.wait(10)


async def _burst(d: Service, addr: str) -> Counter[str]:
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = dispatcher_pb2_grpc.DispatcherStub(channel)
        await stub.ListModels(pb.ListModelsRequest(), timeout=30)  # connected and warm

        async def one() -> str:
            try:
                await stub.ListModels(pb.ListModelsRequest(), timeout=60)
                return "OK"
            except grpc.aio.AioRpcError as e:
                return f"{e.code().name}: {e.details()}"

        os.kill(d.proc.pid, signal.SIGSTOP)
        try:
            calls = [asyncio.create_task(one()) for _ in range(BURST)]
            await asyncio.sleep(1.0)  # every call written to the socket while the dispatcher is frozen
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        return Counter(await asyncio.gather(*calls))


@pytest.mark.e2e
async def test_a_burst_past_grpc_cores_default_backlog_is_answered(dispatcher: tuple[Service, str]) -> None:
    d, addr = dispatcher
    outcomes = await _burst(d, addr)
    assert outcomes == Counter({"OK": BURST}), outcomes
    assert d.stop() == 0
