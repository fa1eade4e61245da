"""Fakes shared by the dispatcher, HTTP, SDK and inspect tests; every fake is named as one.

``FakeRouterServicer`` and ``FakePredictorServicer`` answer the real protos on real ports; ``fake_worker``
drives the real QueueStore the way a worker does (claim, deltas, complete, renew/cancel) but produces canned
text instead of running an engine. ``fake_dependencies`` starts both fakes; ``dispatcher_server`` runs the
real Dispatcher and its gRPC server against them. ``simulated_stack`` is the other end: every service as a
real process, over simulated engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
from redis.asyncio import Redis

from chimera.predictor.v1 import predictor_pb2, predictor_pb2_grpc
from chimera.router.v1 import router_pb2, router_pb2_grpc
from services.common.keys import Keys
from services.common.queue import QueueStore
from services.common.redis_proc import PrivateRedis
from services.common.types import ClaimedRequest, StageResult
from services.dispatcher.coalesce import sources
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.dispatch import Dispatcher
from services.dispatcher.server import DispatcherServer
from services.launcher.config import LauncherSettings
from services.launcher.pool import EngineSpec, PoolSpec
from services.launcher.stack import Stack, running_stack

ENGINES = {"e0": ("m-small", 5.0, 16), "e1": ("m-big", 20.0, 8)}
CONFIDENCE = {"m-small": 0.2, "m-big": 0.9}
PREDICTED = (40.0, 80.0)


class FakeRouterServicer(router_pb2_grpc.RouterServicer):  # type: ignore[misc]
    async def Score(self, request: router_pb2.ScoreRequest, context: grpc.aio.ServicerContext) -> object:  # noqa: N802
        if any("fail-router" in i.text for i in request.items):
            await context.abort(grpc.StatusCode.UNAVAILABLE, "fake router is down")
        conf = {m: CONFIDENCE.get(m, 0.0) for m in request.models}
        return router_pb2.ScoreResponse(
            scores=[router_pb2.ModelScores(confidence=conf) for _ in request.items]
        )


class FakePredictorServicer(predictor_pb2_grpc.PredictorServicer):  # type: ignore[misc]
    async def Predict(  # noqa: N802
        self, request: predictor_pb2.PredictRequest, context: grpc.aio.ServicerContext
    ) -> object:
        if any("fail-predictor" in r.prompt_text for r in request.rows):
            await context.abort(grpc.StatusCode.INTERNAL, "fake predictor broke")
        return predictor_pb2.PredictResponse(
            predictions=[predictor_pb2.Quantiles(values=list(PREDICTED)) for _ in request.rows],
            quantiles=list(request.quantiles),
        )


async def fake_worker(store: QueueStore, engine: str, stop: asyncio.Event) -> None:
    """Answers "Hello" in two deltas; holds requests whose task says "hold" until they are cancelled; runs
    those whose task says "rerun" twice (the first attempt dies after "Hel")."""
    held: dict[str, ClaimedRequest] = {}
    while not stop.is_set():
        for c in await store.claim(engine, "fake-worker", 8, lease_s=10):
            if "hold" in c.request.user_text():
                held[c.request.request_id] = c
                continue
            if "rerun" in c.request.user_text() and c.attempt == 1:
                # Its engine "dies" after the first delta: the request is handed back and runs again.
                await store.publish_delta(engine, c.request.request_id, c.attempt, "Hel", 3)
                await asyncio.sleep(0.3)
                await store.return_claims(engine, [(c.request.request_id, c.attempt, True)])
                continue
            end = 0
            for part in ("Hel", "lo"):
                end += len(part)
                await store.publish_delta(engine, c.request.request_id, c.attempt, part, end)
            await store.complete(c, StageResult("Hello", "stop", 7, 2), None)
        if held:
            renewed = await store.renew(engine, {rid: c.attempt for rid, c in held.items()}, 10)
            for rid in renewed.cancelled:
                await store.complete(held.pop(rid), StageResult("", "cancelled", 7, 0), None)
            for rid in renewed.lost:
                held.pop(rid, None)
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def fake_workers(store: QueueStore) -> AsyncIterator[None]:
    """One ``fake_worker`` per engine of ``ENGINES`` for the duration of the block."""
    stop = asyncio.Event()
    tasks = [asyncio.create_task(fake_worker(store, e, stop)) for e in ENGINES]
    try:
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def register_engines(r: Redis, keys: Keys, heartbeat_ms: int | None = None) -> None:
    hb = int(time.time() * 1000) if heartbeat_ms is None else heartbeat_ms
    for eid, (model, ms, batch) in ENGINES.items():
        await r.sadd(keys.engines(), eid)
        await r.hset(
            keys.engine_info(eid),
            mapping={"model": model, "decode_ms_per_token": ms, "max_batch_size": batch, "heartbeat_ms": hb},
        )


@contextlib.asynccontextmanager
async def fake_server(add: Callable[[object, grpc.aio.Server], None], servicer: object) -> AsyncIterator[str]:
    server = grpc.aio.server()
    add(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


@contextlib.asynccontextmanager
async def fake_dependencies(private_redis: PrivateRedis, keys: Keys) -> AsyncIterator[DispatcherSettings]:
    """Fake router and predictor servers; yields dispatcher settings pointing at them (free ports)."""
    async with (
        fake_server(router_pb2_grpc.add_RouterServicer_to_server, FakeRouterServicer()) as router_addr,
        fake_server(predictor_pb2_grpc.add_PredictorServicer_to_server, FakePredictorServicer()) as pred_addr,
    ):
        yield DispatcherSettings(
            redis_url=private_redis.url,
            key_prefix=keys.prefix,
            port=0,
            http_port=0,
            router_addr=router_addr,
            predictor_addr=pred_addr,
            max_tokens_limit=512,
            max_prompt_chars=2000,
            stream_block_ms=100,
            reaper_interval_s=0.5,
        )


@contextlib.asynccontextmanager
async def dispatcher_server(
    settings: DispatcherSettings, redis: Redis, keys: Keys
) -> AsyncIterator[DispatcherServer]:
    """The real Dispatcher behind its real gRPC server; ``.port`` is the bound port."""
    async with (
        grpc.aio.insecure_channel(settings.router_addr) as rc,
        grpc.aio.insecure_channel(settings.predictor_addr) as pc,
    ):
        d = Dispatcher(
            QueueStore(redis, keys),
            redis,
            *sources(rc, pc, settings),
            settings,
        )
        server = DispatcherServer(d, redis)
        await server.start()
        try:
            yield server
        finally:
            await server.stop()


@contextlib.contextmanager
def simulated_stack(tmp_path: Path, max_num_seqs: int = 4, small_engines: int = 1) -> Iterator[Stack]:
    """The whole stack as real processes (``chimera up``'s launcher) over simulated engines that run ten
    times faster than their profile: ``small_engines`` of the small model (ids small, small2, ...) and one
    of the large; every port is a free one."""
    profile = {"decode_ms_per_token": 33.0, "max_batch_size": 4, "step_ms": [[1, 33.0], [16, 51.6]]}

    def engine(eid: str, model: str, slow: float) -> EngineSpec:
        p = dict(profile, decode_ms_per_token=33.0 * slow, step_ms=[[1, 33.0 * slow], [16, 51.6 * slow]])
        env = {"time_scale": "10", "profile_json": json.dumps(p)}
        return EngineSpec(id=eid, model=model, kind="simulated", max_num_seqs=max_num_seqs, env=env)

    smalls = tuple(
        engine("small" if i == 0 else f"small{i + 1}", "Qwen/Qwen2.5-1.5B-Instruct", 1.0)
        for i in range(small_engines)
    )
    pool = PoolSpec(engines=(*smalls, engine("large", "Qwen/Qwen2.5-7B-Instruct", 3.0)))
    settings = LauncherSettings.ephemeral(tmp_path)
    with running_stack(settings, pool) as stack:
        yield stack
