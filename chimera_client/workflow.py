"""``Workflow``: one multi-agent run (a program) carried through its stages.

It holds the program id and the next stage index, passes them on every stage, and ends the program at exit
with the outcome the caller set (``set_outcome``). Ending also cancels a stage still running, so an
exception inside the block does not leave an engine generating for nobody. A stage that fails does not
advance the stage index: running it again is the same stage, which the dispatcher accepts.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from types import TracebackType
from typing import Protocol

from chimera_client.types import (
    Completion,
    MessageLike,
    ProgramEnd,
    ResponseFormat,
    Sampling,
    TextDelta,
    Tools,
)

# What a workflow needs of its client, so that this module does not import the client (which builds
# workflows): ``AsyncClient`` and ``Client`` are the two implementations.


class AsyncStages(Protocol):
    def stream(
        self,
        messages: Iterable[MessageLike] | str,
        *,
        program_id: str,
        stage: int,
        workflow: str,
        model: str = ...,
        sampling: Sampling = ...,
        request_id: str | None = ...,
        timeout_s: float | None = ...,
        tools: Tools | None = ...,
        response_format: ResponseFormat | None = ...,
    ) -> AsyncIterator[TextDelta | Completion]: ...

    async def generate(
        self,
        messages: Iterable[MessageLike] | str,
        *,
        program_id: str,
        stage: int,
        workflow: str,
        model: str = ...,
        sampling: Sampling = ...,
        request_id: str | None = ...,
        timeout_s: float | None = ...,
        tools: Tools | None = ...,
        response_format: ResponseFormat | None = ...,
    ) -> Completion: ...

    async def end_program(self, program_id: str, outcome: float | None = ...) -> ProgramEnd: ...


class Stages(Protocol):
    def stream(
        self,
        messages: Iterable[MessageLike] | str,
        *,
        program_id: str,
        stage: int,
        workflow: str,
        model: str = ...,
        sampling: Sampling = ...,
        request_id: str | None = ...,
        timeout_s: float | None = ...,
        tools: Tools | None = ...,
        response_format: ResponseFormat | None = ...,
    ) -> Iterator[TextDelta | Completion]: ...

    def generate(
        self,
        messages: Iterable[MessageLike] | str,
        *,
        program_id: str,
        stage: int,
        workflow: str,
        model: str = ...,
        sampling: Sampling = ...,
        request_id: str | None = ...,
        timeout_s: float | None = ...,
        tools: Tools | None = ...,
        response_format: ResponseFormat | None = ...,
    ) -> Completion: ...

    def end_program(self, program_id: str, outcome: float | None = ...) -> ProgramEnd: ...


class _State:
    def __init__(self, workflow: str, program_id: str | None, model: str) -> None:
        self.workflow = workflow
        self.program_id = program_id or f"sdk-{uuid.uuid4().hex}"
        self.pin = model
        self.stage = 0
        self.outcome: float | None = None
        self.model: str | None = None  # the model serving the program, once a stage has run
        self.engine: str | None = None
        self.completions: list[Completion] = []
        self.ended: ProgramEnd | None = None

    def set_outcome(self, outcome: float) -> None:
        """The workflow's score in [0, 1], sent with EndProgram as a training label."""
        if not 0.0 <= outcome <= 1.0:
            raise ValueError(f"outcome must be in [0, 1], got {outcome}")
        self.outcome = outcome

    def _done(self, c: Completion) -> Completion:
        self.completions.append(c)
        self.model, self.engine = c.model, c.engine
        self.stage += 1
        return c

    def _check_open(self) -> None:
        if self.ended is not None:
            raise RuntimeError(f"workflow {self.program_id} has ended")


class AsyncWorkflow(_State):
    def __init__(self, client: AsyncStages, workflow: str, *, program_id: str | None, model: str) -> None:
        super().__init__(workflow, program_id, model)
        self._client = client

    async def __aenter__(self) -> AsyncWorkflow:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.ended is None:
            await self.end()

    async def stream_stage(
        self,
        messages: Iterable[MessageLike] | str,
        *,
        sampling: Sampling = Sampling(),
        request_id: str | None = None,
        timeout_s: float | None = None,
        tools: Tools | None = None,
        response_format: ResponseFormat | None = None,
    ) -> AsyncIterator[TextDelta | Completion]:
        """Run the next stage, streaming; the stage index advances once its Completion arrives."""
        self._check_open()
        async for ev in self._client.stream(
            messages,
            program_id=self.program_id,
            stage=self.stage,
            workflow=self.workflow,
            model=self.pin,
            sampling=sampling,
            request_id=request_id,
            timeout_s=timeout_s,
            tools=tools,
            response_format=response_format,
        ):
            yield self._done(ev) if isinstance(ev, Completion) else ev

    async def run_stage(
        self,
        messages: Iterable[MessageLike] | str,
        *,
        sampling: Sampling = Sampling(),
        request_id: str | None = None,
        timeout_s: float | None = None,
        tools: Tools | None = None,
        response_format: ResponseFormat | None = None,
    ) -> Completion:
        """Run the next stage to completion."""
        self._check_open()
        c = await self._client.generate(
            messages,
            program_id=self.program_id,
            stage=self.stage,
            workflow=self.workflow,
            model=self.pin,
            sampling=sampling,
            request_id=request_id,
            timeout_s=timeout_s,
            tools=tools,
            response_format=response_format,
        )
        return self._done(c)

    async def end(self, outcome: float | None = None) -> ProgramEnd:
        """End the program (idempotent); ``outcome`` overrides the one set before."""
        if outcome is not None:
            self.set_outcome(outcome)
        if self.ended is None:
            self.ended = await self._client.end_program(self.program_id, self.outcome)
        return self.ended


class Workflow(_State):
    def __init__(self, client: Stages, workflow: str, *, program_id: str | None, model: str) -> None:
        super().__init__(workflow, program_id, model)
        self._client = client

    def __enter__(self) -> Workflow:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.ended is None:
            self.end()

    def stream_stage(
        self,
        messages: Iterable[MessageLike] | str,
        *,
        sampling: Sampling = Sampling(),
        request_id: str | None = None,
        timeout_s: float | None = None,
        tools: Tools | None = None,
        response_format: ResponseFormat | None = None,
    ) -> Iterator[TextDelta | Completion]:
        self._check_open()
        for ev in self._client.stream(
            messages,
            program_id=self.program_id,
            stage=self.stage,
            workflow=self.workflow,
            model=self.pin,
            sampling=sampling,
            request_id=request_id,
            timeout_s=timeout_s,
            tools=tools,
            response_format=response_format,
        ):
            yield self._done(ev) if isinstance(ev, Completion) else ev

    def run_stage(
        self,
        messages: Iterable[MessageLike] | str,
        *,
        sampling: Sampling = Sampling(),
        request_id: str | None = None,
        timeout_s: float | None = None,
        tools: Tools | None = None,
        response_format: ResponseFormat | None = None,
    ) -> Completion:
        self._check_open()
        c = self._client.generate(
            messages,
            program_id=self.program_id,
            stage=self.stage,
            workflow=self.workflow,
            model=self.pin,
            sampling=sampling,
            request_id=request_id,
            timeout_s=timeout_s,
            tools=tools,
            response_format=response_format,
        )
        return self._done(c)

    def end(self, outcome: float | None = None) -> ProgramEnd:
        if outcome is not None:
            self.set_outcome(outcome)
        if self.ended is None:
            self.ended = self._client.end_program(self.program_id, self.outcome)
        return self.ended
