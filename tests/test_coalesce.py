"""Concurrent dispatches share router and predictor calls: the coalescer alone (unit), then the coalescing
clients against real gRPC servers (fake models behind them, from ``dispatcher_fakes``)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from dispatcher_fakes import (
    CONFIDENCE,
    PREDICTED,
    FakePredictorServicer,
    FakeRouterServicer,
    fake_server,
)

from chimera.predictor.v1 import predictor_pb2_grpc
from chimera.router.v1 import router_pb2_grpc
from services.common.types import ChatMessage, Prediction, SamplingParams, StageRequest
from services.dispatcher.clients import PredictorClient, RouterClient
from services.dispatcher.coalesce import Coalescer, CoalescingPredictor, CoalescingRouter

pytestmark = pytest.mark.timeout(30)


class Echo:
    """Answers each item doubled after a pause; fails a call holding a negative item."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.release = asyncio.Event()

    async def send(self, items: list[int]) -> list[int]:
        self.calls.append(items)
        await self.release.wait()
        if any(i < 0 for i in items):
            raise ValueError("negative")
        return [2 * i for i in items]


async def test_calls_arriving_while_one_is_out_share_the_next() -> None:
    echo = Echo()
    c: Coalescer[int, int] = Coalescer(echo.send, max_inflight=1, max_items=64)
    tasks = [asyncio.create_task(c.call(i)) for i in range(10)]
    await asyncio.sleep(0.01)
    assert echo.calls == [[0]]  # the first went at once, alone: an idle coalescer adds no wait
    echo.release.set()
    assert await asyncio.gather(*tasks) == [2 * i for i in range(10)]
    assert echo.calls == [[0], list(range(1, 10))]


async def test_a_failed_call_fails_its_callers_only() -> None:
    echo = Echo()
    c: Coalescer[int, int] = Coalescer(echo.send, max_inflight=1, max_items=64)
    first = asyncio.create_task(c.call(-1))
    await asyncio.sleep(0.01)
    later = [asyncio.create_task(c.call(i)) for i in (1, 2)]
    echo.release.set()
    with pytest.raises(ValueError):
        await first
    assert await asyncio.gather(*later) == [2, 4]


async def test_a_caller_that_gives_up_does_not_disturb_the_rest() -> None:
    echo = Echo()
    c: Coalescer[int, int] = Coalescer(echo.send, max_inflight=1, max_items=2)
    tasks = [asyncio.create_task(c.call(i)) for i in range(5)]
    await asyncio.sleep(0.01)
    tasks[2].cancel()
    echo.release.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[2], asyncio.CancelledError)
    assert [r for i, r in enumerate(results) if i != 2] == [0, 2, 6, 8]
    assert max(len(call) for call in echo.calls) <= 2  # max_items holds


def _req(i: int) -> StageRequest:
    return StageRequest(
        f"r{i}", f"p{i}", 0, "w", (ChatMessage("user", f"task {i}"),), SamplingParams(max_tokens=64)
    )


async def test_coalescing_clients_over_real_grpc() -> None:
    async with (
        fake_server(router_pb2_grpc.add_RouterServicer_to_server, FakeRouterServicer()) as router_addr,
        fake_server(predictor_pb2_grpc.add_PredictorServicer_to_server, FakePredictorServicer()) as pred_addr,
        grpc.aio.insecure_channel(router_addr) as rc,
        grpc.aio.insecure_channel(pred_addr) as pc,
    ):
        router = CoalescingRouter(RouterClient(rc, 5.0), max_inflight=1, max_items=256)
        predictor = CoalescingPredictor(PredictorClient(pc, 5.0), max_inflight=1, max_items=32)
        # Each caller asks for its own models and gets exactly those.
        asks = [("m-small",), ("m-big",), ("m-small", "m-big")] * 10
        scores = await asyncio.gather(*(router.score(f"t{i}", "w", ms) for i, ms in enumerate(asks)))
        preds = await asyncio.gather(*(predictor.predict(_req(i), ms) for i, ms in enumerate(asks)))
        for ms, score, pred in zip(asks, scores, preds, strict=True):
            assert score == pytest.approx({m: CONFIDENCE[m] for m in ms})
            assert pred == dict.fromkeys(ms, Prediction(int(PREDICTED[0]), int(PREDICTED[1])))
        assert router._c.calls < len(asks) and predictor._c.calls < len(asks)
