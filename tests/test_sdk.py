"""The Python SDK (sync and async) and the examples, against the real dispatcher in process with the fakes
of ``dispatcher_fakes`` (fake router, predictor and workers that answer "Hello")."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from dispatcher_fakes import dispatcher_server, fake_dependencies, fake_workers, register_engines
from redis.asyncio import Redis

from services.common.keys import Keys
from services.common.queue import QueueStore
from services.common.redis_proc import PrivateRedis
from services.sdk import (
    AsyncClient,
    Client,
    Completion,
    DeadlineExceededError,
    DuplicateRequestError,
    InvalidRequestError,
    ModelNotFoundError,
    RequestTooLargeError,
    Sampling,
    StageConflictError,
    TextDelta,
)

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@dataclass
class Sdk:
    client: AsyncClient
    addr: str
    redis: Redis
    keys: Keys


@pytest.fixture
async def sdk(private_redis: PrivateRedis, keys: Keys, redis_client: Redis) -> AsyncIterator[Sdk]:
    await register_engines(redis_client, keys)
    async with (
        fake_workers(QueueStore(redis_client, keys)),
        fake_dependencies(private_redis, keys) as settings,
        dispatcher_server(settings, redis_client, keys) as server,
    ):
        addr = f"127.0.0.1:{server.port}"
        async with AsyncClient(addr, default_timeout_s=20) as client:
            yield Sdk(client, addr, redis_client, keys)


async def _outcomes(s: Sdk) -> dict[str, float]:
    entries = await s.redis.xrange(s.keys.outcomes()) or []
    rows = [json.loads(str((f or {})["row"])) for _, f in entries]
    return {r["program_id"]: r["outcome"] for r in rows}


async def _stage_of(s: Sdk, engine: str, request_id: str) -> int:
    payload = await s.redis.hget(s.keys.request(engine, request_id), "payload")
    return int(json.loads(payload or "{}")["stage"])


async def test_async_workflow_carries_program_and_stage_and_ends_with_outcome(sdk: Sdk) -> None:
    events: list[TextDelta | Completion] = []
    async with sdk.client.workflow("code/planner-coder") as wf:
        plan = await wf.run_stage([("system", "plan"), ("user", "write a sorter")])
        events = [ev async for ev in wf.stream_stage(["write a sorter", ("assistant", plan.text), "code it"])]
        review = await wf.run_stage([{"role": "user", "content": "review"}], sampling=Sampling(max_tokens=16))
        wf.set_outcome(0.75)
        assert not await sdk.redis.exists(sdk.keys.outcomes())  # nothing is sent before the block ends
    # One or two deltas: those that reach the front door together go out as one.
    assert [type(e).__name__ for e in events][-1] == "Completion" and len(events) in (2, 3)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Hello"
    stream_final = events[-1]
    assert isinstance(stream_final, Completion)
    done = [plan, stream_final, review]
    assert wf.completions == done and wf.stage == 3
    assert {c.engine for c in done} == {"e1"} and {c.model for c in done} == {"m-big"}
    assert [await _stage_of(sdk, "e1", c.request_id) for c in done] == [0, 1, 2]
    programs = {await sdk.redis.hget(sdk.keys.request("e1", c.request_id), "program_id") for c in done}
    assert programs == {wf.program_id}
    assert (await _outcomes(sdk))[wf.program_id] == 0.75
    assert wf.ended is not None and wf.ended.found
    assert not await sdk.redis.exists(sdk.keys.program(wf.program_id))
    with pytest.raises(RuntimeError):
        await wf.run_stage("after the end")


async def test_workflow_ends_its_program_when_the_block_raises(sdk: Sdk) -> None:
    with pytest.raises(ZeroDivisionError):
        async with sdk.client.workflow("math/solver") as wf:
            await wf.run_stage("solve x")
            _ = 1 / 0
    assert not await sdk.redis.exists(sdk.keys.program(wf.program_id))
    assert wf.program_id not in await _outcomes(sdk)  # no outcome was set, none is recorded


async def test_errors_map_to_sdk_exceptions(sdk: Sdk) -> None:
    c = sdk.client
    with pytest.raises(InvalidRequestError) as bad:
        await c.generate([("wizard", "x")], program_id="p-e", stage=0, workflow="w")
    assert bad.value.code == "INVALID_ARGUMENT" and "role" in bad.value.details
    with pytest.raises(RequestTooLargeError):
        await c.generate("x" * 2001, program_id="p-e", stage=0, workflow="w")
    with pytest.raises(ModelNotFoundError):
        await c.generate("hi", program_id="p-e", stage=0, workflow="w", model="m-huge")
    await c.generate("hi", program_id="p-e", stage=2, workflow="w", request_id="r-e")
    with pytest.raises(DuplicateRequestError):
        await c.generate("hi", program_id="p-e", stage=3, workflow="w", request_id="r-e")
    with pytest.raises(StageConflictError):
        await c.generate("hi", program_id="p-e", stage=1, workflow="w")
    with pytest.raises(DeadlineExceededError):
        await c.generate("hold on", program_id="p-slow", stage=0, workflow="w", timeout_s=0.3)
    end = await c.end_program("p-slow")
    assert end.found


async def test_sync_client_and_examples_run_against_the_dispatcher(sdk: Sdk) -> None:
    def sync_part() -> tuple[list[str], float]:
        with Client(sdk.addr, default_timeout_s=20) as client:
            names = [m.name for m in client.list_models()]
            with pytest.raises(StageConflictError):
                with client.workflow("w", model="m-small") as wf:
                    wf.run_stage("one")
                    client.generate("two", program_id=wf.program_id, stage=1, workflow="w", model="m-big")
        return names, _load("math_workflow").run(sdk.addr, max_tokens=32)

    names, math_outcome = await asyncio.to_thread(sync_part)
    assert names == ["m-big", "m-small"]
    assert math_outcome == 0.0  # the fake worker answers "Hello": no number, a wrong answer
    code_outcome = await _load("code_workflow").run(sdk.addr, max_tokens=32)
    assert code_outcome == 0.0  # "Hello" defines no is_palindrome: the sandboxed tests fail
    assert sorted((await _outcomes(sdk)).values()) == [0.0, 0.0]
    assert [k async for k in sdk.redis.scan_iter(match=sdk.keys.program_pattern())] == []


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _wait_state(s: Sdk, engine: str, rid: str, state: str, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        if await s.redis.hget(s.keys.request(engine, rid), "state") == state:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{rid} never reached {state}")


async def test_abandoned_stage_is_cancelled_and_ending_cancels_a_running_one(sdk: Sdk) -> None:
    async with sdk.client.workflow("code/coder") as wf:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(wf.run_stage("hold it", request_id="r-abandon"), 1.0)
        await _wait_state(sdk, "e1", "r-abandon", "cancelled")
        assert wf.stage == 0  # a failed stage does not advance; running it again is the same stage
        running = asyncio.create_task(wf.run_stage("hold this too", request_id="r-end"))
        await _wait_state(sdk, "e1", "r-end", "running")
        end = await wf.end(outcome=0.0)
        assert (end.found, end.cancelled_requests) == (True, 1)
        assert (await asyncio.wait_for(running, 10)).finish_reason == "cancelled"
    assert (await _outcomes(sdk))[wf.program_id] == 0.0
