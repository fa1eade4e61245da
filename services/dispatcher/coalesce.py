"""``Coalescer``: concurrent dispatches share one router call and one predictor call.

NOTE(coalesce): each first stage asks the router and the predictor for one item each, and every gRPC call
costs both sides far more CPU than the model does (a tf-idf score is about 0.06 ms and a forest prediction
0.26 ms; a bare gRPC call costs the server 0.5 ms, a router call 0.8 ms). Under load many dispatches overlap,
so a call that arrives while ``max_inflight`` calls are already out waits for the next one, which carries
every item that waited: no timer, so an idle front door adds no latency, and the busier it is the fuller the
calls. Both services take many items per call, so this costs them nothing but bigger batches.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Generic, TypeVar

import grpc

from services.common.types import Prediction, StageRequest
from services.dispatcher.clients import ConfidenceSource, LengthSource, PredictorClient, RouterClient
from services.dispatcher.config import DispatcherSettings

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741


class Coalescer(Generic[I, O]):
    def __init__(
        self, send: Callable[[list[I]], Awaitable[list[O]]], max_inflight: int, max_items: int
    ) -> None:
        self._send = send
        self._max_inflight = max_inflight
        self._max_items = max_items
        self._waiting: list[tuple[I, asyncio.Future[O]]] = []
        self._inflight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.calls = 0  # sent, for tests and metrics
        self.items = 0

    async def call(self, item: I) -> O:
        fut: asyncio.Future[O] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, fut))
        self._kick()
        return await fut

    def _kick(self) -> None:
        while self._waiting and self._inflight < self._max_inflight:
            batch, self._waiting = self._waiting[: self._max_items], self._waiting[self._max_items :]
            self._inflight += 1
            task = asyncio.create_task(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[tuple[I, asyncio.Future[O]]]) -> None:
        self.calls += 1
        self.items += len(batch)
        try:
            outs = await self._send([item for item, _ in batch])
            if len(outs) != len(batch):
                raise RuntimeError(f"{len(outs)} answers for {len(batch)} items")
        except Exception as e:  # every caller of the call learns it failed (each then degrades)
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
        else:
            for (_, fut), out in zip(batch, outs, strict=True):
                if not fut.done():  # its caller may have given up (cancelled) meanwhile
                    fut.set_result(out)
        finally:
            self._inflight -= 1
            self._kick()


class CoalescingRouter:
    """A ``ConfidenceSource`` whose concurrent calls share router calls (each asks for every model any
    of them asks for; each gets its own)."""

    def __init__(self, client: RouterClient, max_inflight: int, max_items: int) -> None:
        self._client = client
        self._c: Coalescer[tuple[str, str, tuple[str, ...]], Mapping[str, float]] = Coalescer(
            self._send, max_inflight, max_items
        )

    async def _send(self, items: list[tuple[str, str, tuple[str, ...]]]) -> list[Mapping[str, float]]:
        models = sorted({m for _, _, ms in items for m in ms})
        rows = await self._client.score_many([(text, workflow) for text, workflow, _ in items], models)
        return [{m: row[m] for m in ms if m in row} for (_, _, ms), row in zip(items, rows, strict=True)]

    async def score(self, text: str, workflow: str, models: Sequence[str]) -> Mapping[str, float]:
        return await self._c.call((text, workflow, tuple(models)))


class CoalescingPredictor:
    """A ``LengthSource`` whose concurrent calls share predictor calls."""

    def __init__(self, client: PredictorClient, max_inflight: int, max_items: int) -> None:
        self._client = client
        self._c: Coalescer[tuple[StageRequest, tuple[str, ...]], Mapping[str, Prediction]] = Coalescer(
            self._client.predict_many, max_inflight, max_items
        )

    async def predict(self, request: StageRequest, models: Sequence[str]) -> Mapping[str, Prediction]:
        return await self._c.call((request, tuple(models)))


# Rows per predictor call stay within its default max_request_items (256) for up to 8 models per request.
_PREDICTOR_ASKS = 32
_ROUTER_ITEMS = 256


def sources(
    router: grpc.aio.Channel, predictor: grpc.aio.Channel, s: DispatcherSettings
) -> tuple[ConfidenceSource, LengthSource]:
    """The router and predictor clients the settings ask for: coalescing unless ``upstream_inflight`` is 0."""
    rc, pc = RouterClient(router, s.router_timeout_s), PredictorClient(predictor, s.predictor_timeout_s)
    if not s.upstream_inflight:
        return rc, pc
    return (
        CoalescingRouter(rc, s.upstream_inflight, _ROUTER_ITEMS),
        CoalescingPredictor(pc, s.upstream_inflight, _PREDICTOR_ASKS),
    )
