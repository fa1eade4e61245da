"""Tool-using agents of the real frameworks through both doors of a real stack (every service a process):
LangGraph's prebuilt ``create_react_agent`` with a ``ToolNode`` on ``ChimeraChatModel`` and on ``ChatOpenAI``
pointed at the HTTP door, and an OpenAI Agents SDK agent with a function tool over the gRPC provider and
over the HTTP door.

The engines are SIMULATED (a measuring instrument): they call the first offered tool with placeholder
arguments (its schema's required properties: an integer is 1) until a tool's result comes back, then answer
in text, deterministically (services.worker.engine.simulated_inputs.simulated_call). So these tests show the
plumbing (tools in, calls out as the frameworks' own types, results back as tool turns, the loop ending),
not a model's skill: tests/test_tools_vllm.py and bench/results/tools.md run a real model. Over the HTTP door
the frameworks send no Chimera header: each loop must still be one program (conversation continuation)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from dispatcher_fakes import simulated_stack

from services.launcher.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with simulated_stack(tmp_path_factory.mktemp("frameworks-tools")) as s:
        yield s


class Programs:
    """What the HTTP door said of each call's program (its X-Chimera-* response headers), read by an httpx
    hook on the framework's own client: the frameworks send no Chimera header, so the door finds the program
    by conversation continuation."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []  # (program, stage, identity) per call

    def _record(self, response: httpx.Response) -> None:
        h = response.headers
        self.seen.append((h["x-chimera-program-id"], h["x-chimera-stage"], h["x-chimera-identity"]))

    async def _arecord(self, response: httpx.Response) -> None:
        self._record(response)

    def client(self) -> httpx.Client:
        return httpx.Client(event_hooks={"response": [self._record]}, timeout=60)

    def async_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(event_hooks={"response": [self._arecord]}, timeout=60)

    def assert_one_loop(self) -> None:
        """The tool call and the answer after its result: one program, stages 0 and 1."""
        assert len({p for p, _, _ in self.seen}) == 1, self.seen
        assert [(s, i) for _, s, i in self.seen] == [("0", "new"), ("1", "continuation")]


class Adder:
    """An ``add`` tool that remembers what it was called with."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        self.calls.append((a, b))
        return a + b


def _react_agent(llm: object, adder: Adder) -> object:
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    return create_react_agent(llm, [tool(adder.add)])


@pytest.mark.parametrize("door", ["grpc", "http"])
def test_a_langgraph_react_agent_calls_its_tool_and_finishes(stack: Stack, door: str) -> None:
    from langchain_core.messages import AIMessage, ToolMessage

    programs = Programs()
    if door == "grpc":
        from chimera_client.langchain import ChimeraChatModel

        llm: object = ChimeraChatModel(addr=stack.dispatcher_addr, max_tokens=16)
    else:
        from langchain_openai import ChatOpenAI

        llm = ChatOpenAI(
            base_url=f"http://{stack.http_addr}/v1",
            api_key="unused",
            model="auto",
            max_tokens=16,
            http_client=programs.client(),
        )
    adder = Adder()
    out = _react_agent(llm, adder).invoke({"messages": [("user", "What is 1 plus 1? Use add.")]})  # type: ignore[attr-defined]
    messages = out["messages"]
    assert adder.calls == [(1, 1)]  # the simulated engine's call, executed by the ToolNode
    calls = [m for m in messages if isinstance(m, AIMessage) and m.tool_calls]
    assert len(calls) == 1 and calls[0].tool_calls[0]["name"] == "add"
    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert [r.content for r in results] == ["2"] and results[0].tool_call_id == calls[0].tool_calls[0]["id"]
    last = messages[-1]
    assert isinstance(last, AIMessage) and not last.tool_calls and last.content
    if door == "http":
        programs.assert_one_loop()


def test_a_langchain_model_streams_its_call(stack: Stack) -> None:
    from langchain_core.tools import tool

    from chimera_client.langchain import ChimeraChatModel

    adder = Adder()
    llm = ChimeraChatModel(addr=stack.dispatcher_addr, max_tokens=16).bind_tools(
        [tool(adder.add)], tool_choice="any"
    )
    whole = None
    for chunk in llm.stream("Add 2 and 3."):
        whole = chunk if whole is None else whole + chunk
    assert whole is not None and [c["name"] for c in whole.tool_calls] == ["add"]
    assert whole.tool_calls[0]["args"] == {"a": 1, "b": 1}


@pytest.mark.parametrize("door", ["grpc", "http"])
async def test_an_agents_sdk_agent_calls_its_function_tool_and_finishes(stack: Stack, door: str) -> None:
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool
    from openai import AsyncOpenAI

    from chimera_client.agents import ChimeraModelProvider

    adder, programs = Adder(), Programs()
    agent_tool = function_tool(adder.add)
    if door == "grpc":
        async with ChimeraModelProvider("tools/add", addr=stack.dispatcher_addr, timeout_s=60) as chimera:
            agent = Agent(name="calc", instructions="Use add.", tools=[agent_tool])
            result = await Runner.run(agent, "What is 1 plus 1?", run_config=chimera.run_config())
        assert [s.stage for s in chimera.run.stages] == [0, 1]  # the call and the answer: one program
    else:
        client = AsyncOpenAI(
            base_url=f"http://{stack.http_addr}/v1",
            api_key="unused",
            max_retries=0,
            http_client=programs.async_client(),
        )
        model = OpenAIChatCompletionsModel(model="auto", openai_client=client)
        agent = Agent(name="calc", instructions="Use add.", tools=[agent_tool], model=model)
        from agents import RunConfig

        result = await Runner.run(agent, "What is 1 plus 1?", run_config=RunConfig(tracing_disabled=True))
        await client.close()
        programs.assert_one_loop()
    assert adder.calls == [(1, 1)]
    assert isinstance(result.final_output, str) and result.final_output


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
async def test_the_agents_sdk_default_model_runs_over_the_responses_api(stack: Stack, stream: bool) -> None:
    from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool
    from openai import AsyncOpenAI

    adder, programs = Adder(), Programs()
    client = AsyncOpenAI(
        base_url=f"http://{stack.http_addr}/v1",
        api_key="unused",
        max_retries=0,
        http_client=programs.async_client(),
    )
    model = OpenAIResponsesModel(model="auto", openai_client=client)
    agent = Agent(name="calc", instructions="Use add.", tools=[function_tool(adder.add)], model=model)
    config = RunConfig(tracing_disabled=True)
    if stream:
        result: object = Runner.run_streamed(agent, "What is 1 plus 1?", run_config=config)
        async for _ in result.stream_events():  # type: ignore[attr-defined]
            pass
    else:
        result = await Runner.run(agent, "What is 1 plus 1?", run_config=config)
    await client.close()
    assert adder.calls == [(1, 1)]
    final = result.final_output  # type: ignore[attr-defined]
    assert isinstance(final, str) and final
    programs.assert_one_loop()


def test_a_responses_call_has_openais_shape_streamed_and_not(stack: Stack) -> None:
    import openai

    client = openai.OpenAI(base_url=f"http://{stack.http_addr}/v1", api_key="unused", max_retries=0)
    tools = [{"type": "function", "name": "add", "parameters": {"type": "object", "required": ["a", "b"],
              "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}]  # fmt: skip
    called = client.responses.create(model="auto", input="Add 1 and 1.", tools=tools, tool_choice="required")  # type: ignore[arg-type]
    (call,) = [o for o in called.output if o.type == "function_call"]
    assert (call.name, call.arguments, called.status) == ("add", '{"a": 1, "b": 1}', "completed")
    history = [
        {"role": "user", "content": "Add 1 and 1."},
        {"type": "function_call", "call_id": call.call_id, "name": "add", "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "2"},
    ]
    events = list(
        client.responses.create(model="auto", input=history, tools=tools, stream=True, max_output_tokens=8)
    )  # type: ignore[arg-type, call-overload]
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == events[-1].response.output_text
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="auto", input="x", previous_response_id="resp_1")
    assert err.value.body["param"] == "previous_response_id"  # type: ignore[index]
    client.close()
