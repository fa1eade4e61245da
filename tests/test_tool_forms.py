"""Tools, tool calls and formats in the one typed form: validation, the gRPC mapping, the relay's pieces, the
SSE stream's finishing pieces, a StageRequest's JSON, and the simulated engine's deterministic calls (fast
unit tests; tests/test_tools_vllm.py runs the real path)."""

from __future__ import annotations

import json
import time

import pytest

from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from services.common.chat import ResponseFormat, Tool, ToolCall, ToolCallPiece, ToolUse, merge_pieces
from services.common.queue_records import OutputEvent
from services.common.types import ChatMessage, Prediction, SamplingParams, StageRequest
from services.dispatcher.errors import InvalidRequest
from services.dispatcher.grpc_forms import completion, intake_of, text_delta
from services.dispatcher.handoff import Delta, Dispatched, Final
from services.dispatcher.sse_calls import CallsSent
from services.dispatcher.stream import _Relay
from services.dispatcher.validate import Limits, validate_request
from services.worker.engine.simulated import SimulatedEngine
from services.worker.engine.simulated_inputs import measured_style_profile, simulated_call
from services.worker.records import stage_result

pytestmark = pytest.mark.unit

ADD = Tool(
    "add",
    "Add",
    json.dumps(
        {
            "type": "object",
            "required": ["a", "b"],
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        }
    ),
)
LIMITS = Limits(max_tokens_limit=4096, max_prompt_chars=100_000)


def _req(
    messages: tuple[ChatMessage, ...] = (ChatMessage("user", "add 1 and 2"),), **kw: object
) -> StageRequest:
    fields = {"sampling": SamplingParams(max_tokens=64), **kw}
    return StageRequest("r1", "p1", 0, "tools/add", messages, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"tool_use": ToolUse((Tool("no spaces"),))}, r"tools\[0\]\.function\.name"),
        ({"tool_use": ToolUse((ADD, ADD))}, "unique"),
        ({"tool_use": ToolUse((), "required")}, "needs tools"),
        ({"tool_use": ToolUse((ADD,), "function", "mul")}, "not in tools"),
        ({"tool_use": ToolUse((Tool("f", parameters="[1]"),))}, "must be a JSON object"),
        ({"tool_use": ToolUse(tuple(Tool(f"f{i}") for i in range(129)))}, "the limit is 128"),
        ({"response_format": ResponseFormat("json_schema", "{not json")}, "not valid JSON"),
        ({"sampling": SamplingParams(top_k=-2)}, "top_k"),
        ({"sampling": SamplingParams(repetition_penalty=0.0)}, "repetition_penalty"),
        ({"sampling": SamplingParams(presence_penalty=3.0)}, "presence_penalty"),
    ],
)
def test_a_bad_tool_format_or_sampling_field_is_refused_by_name(kw: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        validate_request(_req(**kw), LIMITS)


def test_a_tool_history_is_checked() -> None:
    user = ChatMessage("user", "add")
    with pytest.raises(InvalidRequest, match="tool_call_id is required"):
        validate_request(_req((user, ChatMessage("tool", "3"))), LIMITS)
    with pytest.raises(InvalidRequest, match="arguments is not valid JSON"):
        validate_request(_req((user, ChatMessage("assistant", "", (ToolCall("c", "add", "{"),)))), LIMITS)
    with pytest.raises(InvalidRequest, match="only an assistant"):
        validate_request(_req((ChatMessage("user", "x", (ToolCall("c", "add", "{}"),)),)), LIMITS)
    ok = (
        user,
        ChatMessage("assistant", "", (ToolCall("c", "add", "{}"),)),
        ChatMessage("tool", "3", tool_call_id="c"),
    )
    validate_request(_req(ok, tool_use=ToolUse((ADD,))), LIMITS)
    assert validate_request(_req(sampling=SamplingParams(temperature=None, top_p=None)), LIMITS) is None


def test_a_stage_request_keeps_its_tools_format_and_history_through_json() -> None:
    req = _req(
        (
            ChatMessage("user", "x"),
            ChatMessage("assistant", "", (ToolCall("c", "add", "{}"),)),
            ChatMessage("tool", "3", tool_call_id="c"),
        ),
        tool_use=ToolUse((ADD,), "function", "add", parallel=False),
        response_format=ResponseFormat("json_object"),
        sampling=SamplingParams(max_tokens=9, top_k=20, repetition_penalty=None),
    )
    assert StageRequest.from_json(req.to_json()) == req


def test_the_grpc_door_maps_tools_formats_and_unset_sampling_fields() -> None:
    msg = pb.GenerateRequest(
        program_id="p",
        stage=0,
        workflow="w",
        messages=[
            pb.ChatMessage(role="assistant", tool_calls=[pb.ToolCall(id="c", name="add", arguments="{}")]),
            pb.ChatMessage(role="tool", content="3", tool_call_id="c"),
        ],
        tools=[pb.Tool(name="add", parameters_json=ADD.parameters)],
        tool_choice=pb.ToolChoice(mode="function", function="add"),
        response_format=pb.ResponseFormat(type="json_object"),
        sampling=pb.SamplingParams(top_k=5),
    )
    got = intake_of(msg)
    assert got.tool_use == ToolUse((Tool("add", "", ADD.parameters),), "function", "add", True)
    assert got.response_format == ResponseFormat("json_object")
    assert got.messages[0].tool_calls == (ToolCall("c", "add", "{}"),) and got.messages[1].tool_call_id == "c"
    assert (got.sampling.top_k, got.sampling.min_p, got.sampling.repetition_penalty) == (5, None, None)
    assert intake_of(pb.GenerateRequest(program_id="p")).tool_use is None
    with pytest.raises(InvalidRequest, match="tool_choice.mode"):
        intake_of(pb.GenerateRequest(tool_choice=pb.ToolChoice(mode="sometimes")))


def test_pieces_merge_into_calls_and_the_final_event_carries_them() -> None:
    d = Dispatched(_req(), "e0", "m", Prediction(1, 2), 0.0, time.time(), 0.0, ())
    relay = _Relay(d, time.time)
    tc0 = [ToolCallPiece(0, "c1", "add").wire()]
    events = [
        OutputEvent("1", {"t": "delta", "a": 1, "text": "Let me add. "}),
        OutputEvent("2", {"t": "delta", "a": 1, "text": "", "tc": tc0}),
        OutputEvent("3", {"t": "delta", "a": 1, "text": "", "tc": [[0, "", "", '{"a": 1,']]}),
        OutputEvent("4", {"t": "delta", "a": 1, "text": "", "tc": [[0, "", "", ' "b": 2}']]}),
        OutputEvent(
            "5",
            {
                "t": "final",
                "a": 1,
                "text": "Let me add. ",
                "finish_reason": "tool_calls",
                "tool_calls": [{"id": "c1", "name": "add", "arguments": '{"a": 1, "b": 2}'}],
            },
        ),
    ]
    delta, final = relay.items(events)
    assert isinstance(delta, Delta) and isinstance(final, Final)
    assert delta.text == "Let me add. "
    assert delta.tool_calls == (ToolCallPiece(0, "c1", "add", '{"a": 1, "b": 2}'),)
    assert final.tool_calls == (ToolCall("c1", "add", '{"a": 1, "b": 2}'),)
    assert text_delta(delta).tool_calls[0].name == "add"
    assert completion(final).tool_calls[0].arguments == '{"a": 1, "b": 2}'


def test_merging_keeps_distinct_calls_apart() -> None:
    pieces = [
        ToolCallPiece(0, "a", "f", "{"),
        ToolCallPiece(0, arguments="}"),
        ToolCallPiece(1, "b", "g", "{}"),
    ]
    assert merge_pieces(pieces) == (ToolCallPiece(0, "a", "f", "{}"), ToolCallPiece(1, "b", "g", "{}"))


def test_an_sse_stream_finishes_its_calls_from_the_final_answer() -> None:
    sent = CallsSent()
    sent.note((ToolCallPiece(0, "c1", "add", '{"a"'),))
    calls = (ToolCall("c1", "add", '{"a": 1}'), ToolCall("c2", "add", "{}"))
    assert sent.rest(calls) == (ToolCallPiece(0, arguments=": 1}"), ToolCallPiece(1, "c2", "add", "{}"))
    assert sent.rest((ToolCall("c1", "add", '{"b": 1}'),)) is None  # a re-run answered differently
    assert sent.rest(()) is None  # a call was streamed that the answer lacks


def test_the_simulated_engine_calls_deterministically_and_answers_a_result() -> None:
    use = ToolUse((ADD,), "required")
    call = simulated_call(_req(tool_use=use))
    assert call is not None and call == simulated_call(_req(tool_use=use))
    assert (call.name, json.loads(call.arguments)) == ("add", {"a": 1, "b": 1})
    after = (
        ChatMessage("user", "x"),
        ChatMessage("assistant", "", (call,)),
        ChatMessage("tool", "2", tool_call_id=call.id),
    )
    assert simulated_call(_req(after, tool_use=ToolUse((ADD,)))) is None  # auto, after a result: it answers
    assert simulated_call(_req(tool_use=ToolUse((ADD,), "none"))) is None


async def test_the_simulated_engine_streams_a_call_in_pieces() -> None:
    engine = SimulatedEngine("m", measured_style_profile(4), time_scale=1000.0)
    await engine.start()
    try:
        pieces, final = [], None
        async for out in engine.generate(_req(tool_use=ToolUse((ADD,), "required")), "k", 0):
            pieces += out.tool_pieces
            final = out if out.finished else final
        assert final is not None and len(pieces) > 2
        (call,) = final.tool_calls
        assert "".join(p.arguments for p in pieces) == call.arguments and pieces[0].name == "add"
        assert stage_result(final, "").finish_reason == "tool_calls"
    finally:
        await engine.stop()


def test_an_unset_sampling_field_takes_the_models_default() -> None:
    from services.worker.engine.vllm_engine import vllm_sampling

    defaults = {"temperature": 0.7, "top_k": 20, "min_p": 0.05}
    p = vllm_sampling(SamplingParams(temperature=None, top_k=None, min_p=0.1), 8, 1, defaults)
    assert (p.temperature, p.top_k, p.min_p) == (0.7, 20, 0.1)  # the caller's value wins where it gave one
    plain = vllm_sampling(SamplingParams(temperature=None, top_p=None), 8)
    assert (plain.temperature, plain.top_p, plain.repetition_penalty) == (1.0, 1.0, 1.0)  # vLLM's neutral
