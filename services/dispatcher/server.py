"""Dispatcher gRPC server: proto <-> dataclasses, domain errors -> status codes, lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from redis.asyncio import Redis

from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from chimera.dispatcher.v1 import dispatcher_pb2_grpc
from services.common import tls
from services.common.grpc_status import status_codes
from services.dispatcher.dispatch import Dispatcher
from services.dispatcher.door import DoorGate, backstop
from services.dispatcher.errors import DispatchError, InvalidRequest, Overloaded
from services.dispatcher.grpc_forms import completion, intake_of, text_delta
from services.dispatcher.handoff import Delta
from services.dispatcher.reaper import reap_forever

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Dispatcher"].full_name


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A request whose bytes do not parse, typically a string field that is not UTF-8 (a lone surrogate
    sent as CESU-8). gRPC would answer UNKNOWN from its own deserializer; the servicer answers
    INVALID_ARGUMENT instead."""

    error: str


def _lenient(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as e:  # protobuf's DecodeError; whatever parsing raises, the bytes are bad
            return Undecodable(str(e))

    return deserialize


def decoded(request: object) -> None:
    if isinstance(request, Undecodable):
        raise InvalidRequest(f"the request does not parse (strings must be valid UTF-8): {request.error}")


def add_servicer(servicer: DispatcherServicer, server: grpc.aio.Server) -> None:
    """``add_DispatcherServicer_to_server`` with deserializers that hand an undecodable request to the
    servicer (see ``Undecodable``)."""
    handlers = {
        "Generate": grpc.unary_stream_rpc_method_handler(
            servicer.Generate,
            request_deserializer=_lenient(pb.GenerateRequest.FromString),
            response_serializer=pb.GenerateResponse.SerializeToString,
        ),
        "EndProgram": grpc.unary_unary_rpc_method_handler(
            servicer.EndProgram,
            request_deserializer=_lenient(pb.EndProgramRequest.FromString),
            response_serializer=pb.EndProgramResponse.SerializeToString,
        ),
        "ListModels": grpc.unary_unary_rpc_method_handler(
            servicer.ListModels,
            request_deserializer=_lenient(pb.ListModelsRequest.FromString),
            response_serializer=pb.ListModelsResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def _code(e: Exception) -> grpc.StatusCode | None:
    # Domain errors carry their status code's name; a name gRPC does not know is a bug, hence INTERNAL.
    if isinstance(e, DispatchError):
        return getattr(grpc.StatusCode, e.code, grpc.StatusCode.INTERNAL)
    return None


def _trailers(e: Exception) -> list[tuple[str, str]]:
    # A refusal for load says when to come back, as HTTP's Retry-After does (whole seconds).
    return [("retry-after", e.retry_after)] if isinstance(e, Overloaded) else []


_status_codes = status_codes(_code, log, "dispatcher error; see its log", trailers_of=_trailers)


def _authorization(context: grpc.aio.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return str(value)
    return None


class DispatcherServicer(dispatcher_pb2_grpc.DispatcherServicer):  # type: ignore[misc]
    """Every call of the Dispatcher service holds a place at the door's gate while it runs (Generate: its
    whole stream), so that a full door answers RESOURCE_EXHAUSTED with a retry-after trailer, as any
    overload is answered. ListModels too: it is cheap but a burst of it fills the transport all the same.
    Health and reflection are other servicers and never meet the gate."""

    def __init__(self, dispatcher: Dispatcher, gate: DoorGate) -> None:
        self._d = dispatcher
        self.gate = gate

    async def _tenant(self, context: grpc.aio.ServicerContext) -> str:
        return (await self._d.auth.principal(_authorization(context))).tenant

    @_status_codes
    async def Generate(  # noqa: N802 (gRPC method name)
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        with self.gate.held():
            tenant = await self._tenant(context)
            decoded(request)
            dispatched = await self._d.submit(intake_of(request), tenant)
            async for item in self._d.stream(dispatched):
                if isinstance(item, Delta):
                    yield pb.GenerateResponse(delta=text_delta(item))
                else:
                    yield pb.GenerateResponse(final=completion(item))

    @_status_codes
    async def EndProgram(  # noqa: N802
        self, request: pb.EndProgramRequest, context: grpc.aio.ServicerContext
    ) -> pb.EndProgramResponse:
        with self.gate.held():
            tenant = await self._tenant(context)
            decoded(request)
            outcome = request.outcome if request.HasField("outcome") else None
            end = await self._d.end_program(request.program_id, outcome, tenant)
        return pb.EndProgramResponse(found=end.found, cancelled_requests=end.cancelled_requests)

    @_status_codes
    async def ListModels(  # noqa: N802
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListModelsResponse:
        with self.gate.held():
            tenant = await self._tenant(context)
            decoded(request)
            snaps = await self._d.quotas.visible(tenant, await self._d.engines())
        by_model: dict[str, list[pb.EngineStatus]] = defaultdict(list)
        for snap in snaps:
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


# How long gRPC core keeps a call that the asyncio server has not picked up yet (its default is 30 s).
UNREQUESTED_S = 300


def grpc_server_options(hard_stop: int) -> list[tuple[str, int]]:
    """gRPC core's bounds on calls that arrived but that the asyncio server has not picked up yet.

    The asyncio server asks core for one call of a method at a time, as its loop turns; under a burst
    (refused clients coming back after their Retry-After, all at once) the rest wait in core. Past
    ``grpc.server.max_pending_requests`` (default 1000) core drops new calls at random, and all of them
    past the hard limit (3000), or any that waited longer than the unrequested time: each one ends at
    the client as CANCELLED "CANCELLED", which nothing retries, before the dispatcher ever saw it. Here
    the backlog may grow to the server's hard stop (``maximum_concurrent_rpcs``) instead, past which
    calls are refused anyway, so that a burst is answered late (admitted, or RESOURCE_EXHAUSTED with a
    Retry-After from the door's gate) rather than dropped."""
    return [
        ("grpc.server.max_pending_requests", hard_stop),
        ("grpc.server.max_pending_requests_hard_limit", hard_stop),
        ("grpc.server_max_unrequested_time_in_server", UNREQUESTED_S),
    ]


class DispatcherServer:
    """A started front door: gRPC server, health, reflection and the reaper task, stopped together."""

    def __init__(self, dispatcher: Dispatcher, redis: Redis) -> None:
        self.dispatcher = dispatcher
        self.settings = dispatcher.settings
        self._redis = redis
        self.health = health.aio.HealthServicer()
        # The gate answers a full door with a retry-after; gRPC core's own limit refuses bare, naming no
        # time to come back, so it is only a backstop well above the gate, with room for health checks and
        # for the calls being refused.
        self.gate = DoorGate(self.settings.door_limit())
        hard_stop = backstop(self.gate.limit)
        options = grpc_server_options(hard_stop)
        self.server = grpc.aio.server(maximum_concurrent_rpcs=hard_stop, options=options)
        self.port = 0
        self._reaper: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Bind, start serving and reaping; returns the bound port."""
        s = self.settings
        add_servicer(DispatcherServicer(self.dispatcher, self.gate), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
        )
        transport = tls.server_tls(s.tls_cert_file, s.tls_key_file)
        self.port = tls.add_port(self.server, f"{s.host}:{s.port}", transport)
        await self.server.start()
        self._reaper = asyncio.create_task(
            reap_forever(self.dispatcher.store, self._redis, s.reaper_interval_s, s.replica_name()),
            name="reaper",
        )
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("serving on %s:%d (%s)", s.host, self.port, tls.describe(transport))
        if not self.dispatcher.auth.required:
            log.warning(
                "serving open, without API keys: both doors listen on loopback only (auth=%s)", s.auth
            )
        return self.port

    async def stop(self) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(self.settings.grace_s)
        await self.dispatcher.close()
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
