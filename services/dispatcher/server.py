"""Dispatcher gRPC server: proto <-> dataclasses, domain errors -> status codes, lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from redis.asyncio import Redis

from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from chimera.dispatcher.v1 import dispatcher_pb2_grpc
from services.common.types import ChatMessage, SamplingParams, StageRequest
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.dispatch import Dispatcher
from services.dispatcher.errors import DispatchError
from services.dispatcher.reaper import reap_forever
from services.dispatcher.stream import Delta, Final, stream_output

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Dispatcher"].full_name


def to_stage_request(
    msg: pb.GenerateRequest, settings: DispatcherSettings, clock: Callable[[], float] = time.time
) -> StageRequest:
    """Convert a GenerateRequest, filling the proto's "0 means default" fields. Validation is domain work."""
    now = clock()
    s = msg.sampling
    model = msg.model.strip()
    return StageRequest(
        request_id=msg.request_id or uuid.uuid4().hex,
        program_id=msg.program_id,
        stage=msg.stage,
        workflow=msg.workflow,
        messages=tuple(ChatMessage(m.role, m.content) for m in msg.messages),
        sampling=SamplingParams(
            max_tokens=s.max_tokens or settings.max_tokens_default,
            temperature=s.temperature,
            top_p=s.top_p or 1.0,
            seed=s.seed if s.HasField("seed") else None,
            stop=tuple(s.stop),
        ),
        model_pin=None if model in ("", "auto") else model,
        deadline_unix=now + msg.timeout_ms / 1000.0 if msg.timeout_ms else None,
        received_unix=now,
    )


def _completion(f: Final) -> pb.Completion:
    return pb.Completion(
        request_id=f.request_id,
        text=f.text,
        finish_reason=f.finish_reason,
        usage=pb.Usage(prompt_tokens=f.prompt_tokens, completion_tokens=f.completion_tokens),
        model=f.model,
        engine=f.engine,
        queue_wait_s=f.queue_wait_s,
        e2e_s=f.e2e_s,
        predicted_tokens=f.predicted_tokens,
        predicted_tokens_p90=f.predicted_tokens_p90,
        attempts=f.attempts,
        dispatch_ms=f.dispatch_ms,
        dispatch_timings=pb.DispatchTimings(
            router_ms=f.timings.router_ms,
            predictor_ms=f.timings.predictor_ms,
            policy_ms=f.timings.policy_ms,
            redis_ms=f.timings.redis_ms,
        ),
    )


async def _abort(context: grpc.aio.ServicerContext, e: Exception) -> None:
    """The one place where errors become gRPC status codes; anything unexpected is INTERNAL and logged."""
    if isinstance(e, DispatchError):
        code, message = getattr(grpc.StatusCode, e.code, grpc.StatusCode.INTERNAL), str(e) or e.code
    else:
        log.error("dispatcher call failed", exc_info=e)
        code, message = grpc.StatusCode.INTERNAL, "dispatcher error; see its log"
    await context.abort(code, message)


class DispatcherServicer(dispatcher_pb2_grpc.DispatcherServicer):  # type: ignore[misc]
    def __init__(self, dispatcher: Dispatcher) -> None:
        self._d = dispatcher

    async def Generate(  # noqa: N802 (gRPC method name)
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        s = self._d.settings
        try:
            dispatched = await self._d.dispatch(to_stage_request(request, s))
            async for item in stream_output(self._d.store, self._d.redis, dispatched, s.stream_block_ms):
                if isinstance(item, Delta):
                    yield pb.GenerateResponse(delta=pb.TextDelta(text=item.text, attempt=item.attempt))
                else:
                    yield pb.GenerateResponse(final=_completion(item))
        except Exception as e:  # mapped in _abort
            await _abort(context, e)

    async def EndProgram(  # noqa: N802
        self, request: pb.EndProgramRequest, context: grpc.aio.ServicerContext
    ) -> pb.EndProgramResponse:
        outcome = request.outcome if request.HasField("outcome") else None
        try:
            end = await self._d.end_program(request.program_id, outcome)
        except Exception as e:  # mapped in _abort
            await _abort(context, e)
            raise AssertionError("unreachable: abort raises") from e
        return pb.EndProgramResponse(found=end.found, cancelled_requests=end.cancelled_requests)

    async def ListModels(  # noqa: N802
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListModelsResponse:
        try:
            engines = await self._d.engines()
        except Exception as e:  # mapped in _abort
            await _abort(context, e)
            raise AssertionError("unreachable: abort raises") from e
        by_model: dict[str, list[pb.EngineStatus]] = defaultdict(list)
        for snap in engines:
            by_model[snap.model].append(
                pb.EngineStatus(
                    engine_id=snap.engine_id,
                    alive=snap.alive,
                    queued=snap.queued,
                    running=snap.running,
                    inflight_tokens=snap.inflight_tokens,
                    decode_ms_per_token=snap.profile.decode_ms_per_token,
                    max_batch_size=snap.profile.max_batch_size,
                )
            )
        return pb.ListModelsResponse(
            models=[pb.ModelStatus(name=m, engines=by_model[m]) for m in sorted(by_model)]
        )


class DispatcherServer:
    """A started front door: gRPC server, health, reflection and the reaper task, stopped together."""

    def __init__(self, dispatcher: Dispatcher, redis: Redis) -> None:
        self.dispatcher = dispatcher
        self.settings = dispatcher.settings
        self._redis = redis
        self.health = health.aio.HealthServicer()
        self.server = grpc.aio.server()
        self.port = 0
        self._reaper: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Bind, start serving and reaping; returns the bound port."""
        s = self.settings
        dispatcher_pb2_grpc.add_DispatcherServicer_to_server(DispatcherServicer(self.dispatcher), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
        )
        self.port = self.server.add_insecure_port(f"{s.host}:{s.port}")
        await self.server.start()
        self._reaper = asyncio.create_task(
            reap_forever(self.dispatcher.store, self._redis, s.reaper_interval_s), name="reaper"
        )
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("serving on %s:%d", s.host, self.port)
        return self.port

    async def stop(self) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(self.settings.grace_s)
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper


class FrontDoor(Protocol):
    async def start(self) -> int: ...

    async def stop(self) -> None: ...


async def run(server: DispatcherServer, *others: FrontDoor) -> None:
    """Serve until SIGTERM or SIGINT, then drain gracefully.

    ``others`` (the HTTP front door) start first, so that health turns SERVING only once every door is open.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    for door in others:
        await door.start()
    await server.start()
    await stop.wait()
    log.info("stopping")
    await asyncio.gather(server.stop(), *(door.stop() for door in others))
