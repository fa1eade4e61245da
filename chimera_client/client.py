"""Sync and async clients of the dispatcher's gRPC API.

Both take plain Python values and return the frozen dataclasses of ``chimera_client.types``; every gRPC
failure surfaces as a ``ChimeraError`` subclass chosen by its status code (``chimera_client.errors``).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from types import TracebackType
from typing import cast

import grpc

from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from chimera.dispatcher.v1 import dispatcher_pb2_grpc
from chimera_client import _convert
from chimera_client.errors import from_rpc_error
from chimera_client.retry import Replay, RetryPolicy
from chimera_client.types import (
    Completion,
    MessageLike,
    ModelStatus,
    ProgramEnd,
    ResponseFormat,
    Sampling,
    TextDelta,
    Tools,
    to_messages,
)
from chimera_client.workflow import AsyncWorkflow, Workflow

DEFAULT_ADDR = "127.0.0.1:50051"
API_KEY_ENV = "CHIMERA_API_KEY"


def auth_metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata every call carries: the API key as a bearer token, from the argument or else from
    ``CHIMERA_API_KEY``; nothing when neither is set (a dispatcher without auth)."""
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    return (("authorization", f"Bearer {key}"),) if key else ()


def channel_target(addr: str | Sequence[str]) -> tuple[str, list[tuple[str, str]]]:
    """A gRPC target and channel options for one address, or for several dispatcher replicas, which the
    channel then uses in turn (round robin; a replica that goes away is skipped until it is back). Each of
    several addresses is ``host:port``, resolved here to IPv4 (gRPC's ``ipv4:`` target lists addresses)."""
    if isinstance(addr, str):
        return addr, []
    resolved = []
    for a in addr:
        host, _, port = a.rpartition(":")
        infos = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)
        resolved.append(f"{infos[0][4][0]}:{port}")
    return "ipv4:" + ",".join(resolved), [("grpc.lb_policy_name", "round_robin")]


def _channel(
    addr: str | Sequence[str], credentials: grpc.ChannelCredentials | None, aio: bool
) -> grpc.Channel | grpc.aio.Channel:
    target, options = channel_target(addr)
    if aio:
        if credentials is None:
            return grpc.aio.insecure_channel(target, options)
        return grpc.aio.secure_channel(target, credentials, options)
    if credentials is None:
        return grpc.insecure_channel(target, options)
    return grpc.secure_channel(target, credentials, options)


def new_request_id() -> str:
    """The id every try of one stage carries, so that a retry re-attaches instead of running it again."""
    return f"sdk-{uuid.uuid4().hex}"


def _last(events: Iterable[TextDelta | Completion]) -> Completion:
    final = None
    for ev in events:
        if isinstance(ev, Completion):
            final = ev
    if final is None:
        raise RuntimeError("the stream ended without a final completion")
    return final


def tls_credentials(ca_file: str | None = None) -> grpc.ChannelCredentials:
    """TLS credentials that trust ``ca_file`` (PEM), or the system's roots when None."""
    if ca_file is None:
        return grpc.ssl_channel_credentials()
    with open(ca_file, "rb") as f:
        return grpc.ssl_channel_credentials(root_certificates=f.read())


class AsyncClient:
    """``async with AsyncClient(addr) as client``; one channel, safe to share between tasks."""

    def __init__(
        self,
        addr: str | Sequence[str] = DEFAULT_ADDR,
        *,
        default_timeout_s: float | None = None,
        retry: RetryPolicy = RetryPolicy(),
        api_key: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        """``retry``: what a stage does when the pool is busy or the connection breaks (``NO_RETRY``:
        every failure surfaces at once). ``api_key``: sent on every call (default: ``CHIMERA_API_KEY``).
        ``credentials``: TLS to a door that serves it, e.g. ``grpc.ssl_channel_credentials(ca_pem)``
        (``tls_credentials``); None: plaintext."""
        self.addr = addr
        self._metadata = auth_metadata(api_key)
        self._channel = cast(grpc.aio.Channel, _channel(addr, credentials, aio=True))
        self._stub = dispatcher_pb2_grpc.DispatcherStub(self._channel)
        self._timeout_s = default_timeout_s
        self._retry = retry

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def stream(
        self,
        messages: Iterable[MessageLike] | str,
        *,
        program_id: str,
        stage: int,
        workflow: str,
        model: str = "auto",
        sampling: Sampling = Sampling(),
        request_id: str | None = None,
        timeout_s: float | None = None,
        tools: Tools | None = None,
        response_format: ResponseFormat | None = None,
        final_only: bool = False,
    ) -> AsyncIterator[TextDelta | Completion]:
        """Text deltas as they are generated, then exactly one ``Completion`` (``final_only``: the
        ``Completion`` alone, and the engine is not asked to stream, which ``generate()`` uses).

        A busy pool or a broken connection is retried (``RetryPolicy``) with the same ``request_id`` (one
        is made up when none is given), which re-attaches to the request: the caller sees each piece of
        text once, however many tries it took."""
        req = _convert.generate_request(
            to_messages(messages),
            program_id=program_id,
            stage=stage,
            workflow=workflow,
            model=model,
            sampling=sampling,
            request_id=request_id or new_request_id(),
            timeout_s=timeout_s,
            tools=tools,
            response_format=response_format,
            final_only=final_only,
        )
        replay = Replay()
        # NOTE(sdk-retry): yielding inside an attempt is safe: a caller that stops reading raises
        # GeneratorExit (or CancelledError) here, which no policy retries, so it is re-raised at once.
        tries = self._retry.retrying()
        async for attempt in tries:
            with attempt:
                replay.new_try()
                async for ev in self._one_try(req, timeout_s):
                    tries.progressed()  # NOTE(budget) in retry.py
                    if isinstance(ev, TextDelta):
                        text = replay.fresh(ev.text, ev.attempt)
                        if text or ev.tool_calls:
                            yield TextDelta(text, ev.attempt, ev.tool_calls)
                    else:
                        yield ev

    async def _one_try(
        self, req: pb.GenerateRequest, timeout_s: float | None
    ) -> AsyncIterator[TextDelta | Completion]:
        call = self._stub.Generate(
            req, timeout=_convert.call_timeout(timeout_s, self._timeout_s), metadata=self._metadata
        )
        try:
            async for resp in call:
                ev = _convert.event(resp)
                if isinstance(ev, Completion):
                    # NOTE(sdk-close): the status follows the Completion at once. Take it before handing
                    # the Completion on: a caller that stops reading there would otherwise reach the
                    # cancel below first and reset a stream that had already succeeded.
                    await call.code()
                yield ev
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None
        finally:
            call.cancel()  # no-op once finished; cancels the request if the caller stopped reading

    async def generate(
        self,
        messages: Iterable[MessageLike] | str,
        *,
        program_id: str,
        stage: int,
        workflow: str,
        model: str = "auto",
        sampling: Sampling = Sampling(),
        request_id: str | None = None,
        timeout_s: float | None = None,
        tools: Tools | None = None,
        response_format: ResponseFormat | None = None,
    ) -> Completion:
        """Run one stage to completion: only its ``Completion`` is sent (``stream(final_only=True)``)."""
        events = [
            ev
            async for ev in self.stream(
                messages,
                program_id=program_id,
                stage=stage,
                workflow=workflow,
                model=model,
                sampling=sampling,
                request_id=request_id,
                timeout_s=timeout_s,
                tools=tools,
                response_format=response_format,
                final_only=True,  # nobody reads its deltas: none are relayed
            )
        ]
        return _last(events)

    async def end_program(self, program_id: str, outcome: float | None = None) -> ProgramEnd:
        """End ``program_id`` (its outcome kept as a label). Retried like a stage: ending a program twice
        is harmless, the second try finds nothing left (``found`` false) when the first one landed."""
        req = _convert.end_request(program_id, outcome)
        async for attempt in self._retry.retrying():
            with attempt:
                try:
                    resp = await self._stub.EndProgram(req, timeout=self._timeout_s, metadata=self._metadata)
                except grpc.aio.AioRpcError as e:
                    raise from_rpc_error(e) from None
                return _convert.program_end(resp)
        raise AssertionError("unreachable: a try either returns or raises")

    async def list_models(self) -> tuple[ModelStatus, ...]:
        try:
            resp = await self._stub.ListModels(
                pb.ListModelsRequest(), timeout=self._timeout_s, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None
        return _convert.models(resp)

    def workflow(self, workflow: str, *, program_id: str | None = None, model: str = "auto") -> AsyncWorkflow:
        """A multi-stage run: ``async with client.workflow("code/planner-coder") as wf: ...``."""
        return AsyncWorkflow(self, workflow, program_id=program_id, model=model)


class Client:
    """Blocking twin of ``AsyncClient``, for scripts and threads."""

    def __init__(
        self,
        addr: str | Sequence[str] = DEFAULT_ADDR,
        *,
        default_timeout_s: float | None = None,
        retry: RetryPolicy = RetryPolicy(),
        api_key: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.addr = addr
        self._metadata = auth_metadata(api_key)
        self._channel = cast(grpc.Channel, _channel(addr, credentials, aio=False))
        self._stub = dispatcher_pb2_grpc.DispatcherStub(self._channel)
        self._timeout_s = default_timeout_s
        self._retry = retry

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def stream(
        self,
        messages: Iterable[MessageLike] | str,
        *,
        program_id: str,
        stage: int,
        workflow: str,
        model: str = "auto",
        sampling: Sampling = Sampling(),
        request_id: str | None = None,
        timeout_s: float | None = None,
        tools: Tools | None = None,
        response_format: ResponseFormat | None = None,
        final_only: bool = False,
    ) -> Iterator[TextDelta | Completion]:
        req = _convert.generate_request(
            to_messages(messages),
            program_id=program_id,
            stage=stage,
            workflow=workflow,
            model=model,
            sampling=sampling,
            request_id=request_id or new_request_id(),
            timeout_s=timeout_s,
            tools=tools,
            response_format=response_format,
            final_only=final_only,
        )
        replay = Replay()
        tries = self._retry.retrying_sync()
        for attempt in tries:
            with attempt:
                replay.new_try()
                for ev in self._one_try(req, timeout_s):
                    tries.progressed()
                    if isinstance(ev, TextDelta):
                        text = replay.fresh(ev.text, ev.attempt)
                        if text or ev.tool_calls:
                            yield TextDelta(text, ev.attempt, ev.tool_calls)
                    else:
                        yield ev

    def _one_try(self, req: pb.GenerateRequest, timeout_s: float | None) -> Iterator[TextDelta | Completion]:
        call = self._stub.Generate(
            req, timeout=_convert.call_timeout(timeout_s, self._timeout_s), metadata=self._metadata
        )
        try:
            for resp in call:
                ev = _convert.event(resp)
                if isinstance(ev, Completion):
                    call.code()  # see NOTE(sdk-close)
                yield ev
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        finally:
            call.cancel()

    def generate(
        self,
        messages: Iterable[MessageLike] | str,
        *,
        program_id: str,
        stage: int,
        workflow: str,
        model: str = "auto",
        sampling: Sampling = Sampling(),
        request_id: str | None = None,
        timeout_s: float | None = None,
        tools: Tools | None = None,
        response_format: ResponseFormat | None = None,
    ) -> Completion:
        return _last(
            self.stream(
                messages,
                program_id=program_id,
                stage=stage,
                workflow=workflow,
                model=model,
                sampling=sampling,
                request_id=request_id,
                timeout_s=timeout_s,
                tools=tools,
                response_format=response_format,
                final_only=True,  # nobody reads its deltas: none are relayed
            )
        )

    def end_program(self, program_id: str, outcome: float | None = None) -> ProgramEnd:
        """The blocking twin of ``AsyncClient.end_program`` (retried the same way)."""
        req = _convert.end_request(program_id, outcome)
        for attempt in self._retry.retrying_sync():
            with attempt:
                try:
                    resp = self._stub.EndProgram(req, timeout=self._timeout_s, metadata=self._metadata)
                except grpc.RpcError as e:
                    raise from_rpc_error(e) from None
                return _convert.program_end(resp)
        raise AssertionError("unreachable: a try either returns or raises")

    def list_models(self) -> tuple[ModelStatus, ...]:
        try:
            resp = self._stub.ListModels(
                pb.ListModelsRequest(), timeout=self._timeout_s, metadata=self._metadata
            )
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return _convert.models(resp)

    def workflow(self, workflow: str, *, program_id: str | None = None, model: str = "auto") -> Workflow:
        """A multi-stage run: ``with client.workflow("math/solver-verifier") as wf: ...``."""
        return Workflow(self, workflow, program_id=program_id, model=model)
