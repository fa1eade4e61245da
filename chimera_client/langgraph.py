"""LangGraph: a compiled graph whose model calls carry their workflow identity.

    graph = instrument(builder.compile(name="code/planner-coder"), addr="127.0.0.1:50051")
    state = graph.invoke({"task": "..."})          # one program; each model call the next stage

Each ``invoke``/``ainvoke``/``stream``/``astream`` is one program: its id is the graph run's id (the
LangChain ``run_id`` the run is traced under, taken from the config when given), its workflow the graph's
name. Every model call inside the run, in any node, is the program's next stage. When the run ends the
program is ended over gRPC with an outcome if the graph reports one: a number in [0, 1] under
``outcome_key`` in its final state (or set by a node through ``current_run().set_outcome``).

Two ways to reach Chimera from the graph's nodes, both streaming:

- ``ChimeraChatModel`` (``chimera_client.langchain``): the gRPC SDK as a LangChain chat model.
- ``langchain-openai``'s ``ChatOpenAI`` pointed at the HTTP door, with ``**http_clients()``: its HTTP
  clients add the run's identity headers to every request, and note what each stage was served by.

Needs ``langgraph`` and ``langchain-openai`` (the ``langgraph`` extra).
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

import httpx

from chimera_client.client import DEFAULT_ADDR, AsyncClient, Client
from chimera_client.errors import ChimeraError
from chimera_client.program import (
    H_ENGINE,
    H_MODEL,
    H_STAGE,
    ProgramRun,
    StageRecord,
    active,
    current_run,
)

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.pregel import Pregel

log = logging.getLogger(__name__)
__all__ = ["ChimeraGraph", "current_run", "http_clients", "instrument"]


def instrument(
    graph: Pregel[Any, Any, Any, Any],
    *,
    addr: str = DEFAULT_ADDR,
    api_key: str | None = None,
    workflow: str | None = None,
    outcome_key: str = "outcome",
    on_end: Callable[[ProgramRun], object] | None = None,
) -> ChimeraGraph:
    """``graph`` with every run as one Chimera program (see the module docstring). ``addr``: the gRPC
    front door that ends the programs; ``workflow``: default the graph's name; ``on_end``: called with
    each finished run (its stages, and its outcome if one was reported)."""
    return ChimeraGraph(
        graph, addr=addr, api_key=api_key, workflow=workflow or graph.name, key=outcome_key, on_end=on_end
    )


class ChimeraGraph:
    """A compiled graph whose runs are programs; everything else is the graph's own (``get_state`` ...)."""

    def __init__(
        self,
        graph: Pregel[Any, Any, Any, Any],
        *,
        addr: str,
        api_key: str | None,
        workflow: str,
        key: str,
        on_end: Callable[[ProgramRun], object] | None,
    ) -> None:
        self.graph = graph
        self.workflow = workflow
        self._addr, self._api_key, self._key, self._on_end = addr, api_key, key, on_end

    def __getattr__(self, name: str) -> Any:
        return getattr(self.graph, name)

    def _start(self, config: RunnableConfig | None) -> tuple[ProgramRun, RunnableConfig]:
        run_id = (config or {}).get("run_id") or uuid.uuid4()
        # LangChain traces the run under the program's id.
        with_id: RunnableConfig = {**(config or {}), "run_id": run_id}
        return ProgramRun(self.workflow, str(run_id)), with_id

    def _outcome(self, run: ProgramRun, state: Any) -> float | None:
        found = _outcome_in(state, self._key)
        return found if found is not None else run.outcome

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        run, config = self._start(config)
        state: Any = None
        try:
            with active(run):
                state = self.graph.invoke(input, config, **kwargs)
        finally:
            self._end(run, self._outcome(run, state))
        return state

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        run, config = self._start(config)
        state: Any = None
        try:
            with active(run):
                state = await self.graph.ainvoke(input, config, **kwargs)
        finally:
            await self._aend(run, self._outcome(run, state))
        return state

    def stream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[Any]:
        run, config = self._start(config)
        outcome: float | None = None
        try:
            with active(run):
                for chunk in self.graph.stream(input, config, **kwargs):
                    outcome = _first(_outcome_in(chunk, self._key), outcome)
                    yield chunk
        finally:
            self._end(run, _first(outcome, run.outcome))

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        run, config = self._start(config)
        outcome: float | None = None
        try:
            with active(run):
                async for chunk in self.graph.astream(input, config, **kwargs):
                    outcome = _first(_outcome_in(chunk, self._key), outcome)
                    yield chunk
        finally:
            await self._aend(run, _first(outcome, run.outcome))

    # Ending a program is bookkeeping: a failure to end it is logged, never raised over the run's own
    # result or error (an unended program expires from the dispatcher's table on its own).

    def _end(self, run: ProgramRun, outcome: float | None) -> None:
        try:
            with Client(self._addr, api_key=self._api_key, default_timeout_s=10) as c:
                c.end_program(run.program_id, outcome)
        except ChimeraError as e:
            log.warning("could not end program %s: %s", run.program_id, e)
        self._report(run, outcome)

    async def _aend(self, run: ProgramRun, outcome: float | None) -> None:
        try:
            async with AsyncClient(self._addr, api_key=self._api_key, default_timeout_s=10) as c:
                await c.end_program(run.program_id, outcome)
        except ChimeraError as e:
            log.warning("could not end program %s: %s", run.program_id, e)
        self._report(run, outcome)

    def _report(self, run: ProgramRun, outcome: float | None) -> None:
        if outcome is not None:
            run.outcome = outcome
        if self._on_end is not None:
            self._on_end(run)


def _first(a: float | None, b: float | None) -> float | None:
    return a if a is not None else b


def _outcome_in(state: Any, key: str) -> float | None:
    """The outcome a graph reports: ``key`` in its state, or in one node's update (stream "updates"),
    or in the last element of a (namespace, mode, chunk) tuple that streaming with subgraphs gives."""
    if isinstance(state, tuple) and state:
        state = state[-1]
    candidates = [state, *state.values()] if isinstance(state, dict) else [state]
    for c in candidates:
        value = c.get(key) if isinstance(c, dict) else getattr(c, key, None)
        if isinstance(value, int | float) and not isinstance(value, bool) and 0.0 <= value <= 1.0:
            return float(value)
    return None


def _identify(request: httpx.Request) -> None:
    run = current_run()
    if run is not None:
        request.headers.update(run.headers())


def _note(response: httpx.Response, body: bytes | None) -> None:
    run = current_run()
    stage = response.headers.get(H_STAGE)
    if run is None or stage is None or not stage.isdigit():
        return
    queue_wait: float | None = None
    if body:  # a whole answer carries Chimera's own fields; a stream is left for the caller to read
        with contextlib.suppress(ValueError, KeyError, TypeError):
            queue_wait = float(json.loads(body)["chimera"]["queue_wait_s"])
    model, engine = response.headers.get(H_MODEL, ""), response.headers.get(H_ENGINE, "")
    run.record(StageRecord(int(stage), model, engine, queue_wait))


def _whole(response: httpx.Response) -> bool:
    return str(response.headers.get("content-type", "")).startswith("application/json")


def _note_sync(response: httpx.Response) -> None:
    _note(response, response.read() if _whole(response) else None)


async def _aidentify(request: httpx.Request) -> None:
    _identify(request)


async def _anote(response: httpx.Response) -> None:
    _note(response, await response.aread() if _whole(response) else None)


def http_clients(**httpx_options: Any) -> dict[str, Any]:
    """``ChatOpenAI(base_url=".../v1", model="auto", **http_clients())``: HTTP clients that send the
    current run's program id and workflow with every request (the door makes each the program's next
    stage) and record the stage, model and engine the door answers with. ``httpx_options`` go to both
    clients (``timeout`` ...)."""
    return {
        "http_client": httpx.Client(
            event_hooks={"request": [_identify], "response": [_note_sync]}, **httpx_options
        ),
        "http_async_client": httpx.AsyncClient(
            event_hooks={"request": [_aidentify], "response": [_anote]}, **httpx_options
        ),
    }
