"""The HTTP door's request schema takes tools, formats and vLLM's sampling fields into the one typed form and
refuses, by name, every OpenAI field it cannot honour yet unless the field has its neutral value; explicit
nulls mean the default; the README's table covers every declared field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from services.common.chat import ToolCall
from services.dispatcher.http_input import chat_messages
from services.dispatcher.openai_fields import CHAT_REFUSED, SAMPLING_REFUSED, TEXT_REFUSED, compat_table
from services.dispatcher.openai_schema import ChatCompletionRequest, CompletionRequest

pytestmark = pytest.mark.unit

CHAT: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
TEXT: dict[str, Any] = {"model": "auto", "prompt": "hi"}
TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}

# A value each field cannot be honoured with, as a client would send it.
CHAT_VALUES: dict[str, Any] = {
    "functions": [TOOL["function"]],
    "function_call": "auto",
    "logprobs": True,
    "top_logprobs": 3,
    "prediction": {"type": "content", "content": "x"},
    "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"],
}
TEXT_VALUES: dict[str, Any] = {"logprobs": 2, "echo": True, "best_of": 3, "suffix": "x"}
SAMPLING_VALUES: dict[str, Any] = {"logit_bias": {"50256": -100}}


def _refused_at(model: type[Any], body: dict[str, Any]) -> tuple[Any, ...]:
    with pytest.raises(ValidationError) as err:
        model.model_validate(body)
    first = err.value.errors()[0]
    assert "not supported by Chimera yet" in first["msg"]
    return tuple(first["loc"])


def test_the_tables_and_the_values_here_name_the_same_fields() -> None:
    assert set(CHAT_VALUES) == set(CHAT_REFUSED)
    assert set(TEXT_VALUES) == set(TEXT_REFUSED)
    assert set(SAMPLING_VALUES) == set(SAMPLING_REFUSED)


@pytest.mark.parametrize("name", [*CHAT_VALUES, *SAMPLING_VALUES])
def test_a_chat_field_that_cannot_be_honoured_is_refused_by_name(name: str) -> None:
    value = CHAT_VALUES.get(name, SAMPLING_VALUES.get(name))
    assert _refused_at(ChatCompletionRequest, {**CHAT, name: value}) == (name,)


@pytest.mark.parametrize("name", [*TEXT_VALUES, *SAMPLING_VALUES])
def test_a_completion_field_that_cannot_be_honoured_is_refused_by_name(name: str) -> None:
    value = TEXT_VALUES.get(name, SAMPLING_VALUES.get(name))
    assert _refused_at(CompletionRequest, {**TEXT, name: value}) == (name,)


def test_neutral_values_are_accepted() -> None:
    neutral = {
        "tools": [],
        "tool_choice": "none",
        "response_format": {"type": "text"},
        "logprobs": False,
        "top_logprobs": 0,
        "modalities": ["text"],
        "top_k": -1,
        "min_p": 0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0,
        "repetition_penalty": 1.0,
        "logit_bias": {},
        "parallel_tool_calls": True,
    }
    ChatCompletionRequest.model_validate({**CHAT, **neutral})
    CompletionRequest.model_validate({**TEXT, "echo": False, "best_of": 1, "logprobs": 0})


def test_an_explicit_null_means_the_models_default() -> None:
    req = ChatCompletionRequest.model_validate({**CHAT, "temperature": None, "top_p": None})
    assert (req.temperature, req.top_p) == (None, None)


def test_sampling_fields_are_taken_and_null_means_neutral() -> None:
    fields = {"top_k": 40, "min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": -0.5}
    req = ChatCompletionRequest.model_validate({**CHAT, **fields, "repetition_penalty": 1.1})
    assert (req.top_k, req.min_p, req.presence_penalty, req.frequency_penalty, req.repetition_penalty) == (
        40,
        0.1,
        0.5,
        -0.5,
        1.1,
    )
    nulls = ChatCompletionRequest.model_validate({**CHAT, **dict.fromkeys(fields)})
    # Unset and null alike mean the model's default, which the engine fills in (vllm_sampling).
    assert (nulls.top_k, nulls.min_p, nulls.presence_penalty) == (None, None, None)


def test_tools_and_the_choice_map_to_one_typed_form() -> None:
    req = ChatCompletionRequest.model_validate({**CHAT, "tools": [TOOL], "parallel_tool_calls": False})
    use = req.tool_use()
    assert use is not None
    assert (use.choice, use.parallel, [t.name for t in use.tools]) == ("auto", False, ["add"])
    assert json.loads(use.tools[0].parameters) == {"type": "object"}
    named = {"type": "function", "function": {"name": "add"}}
    forced = ChatCompletionRequest.model_validate({**CHAT, "tools": [TOOL], "tool_choice": named}).tool_use()
    assert forced is not None and (forced.choice, forced.function) == ("function", "add")
    assert ChatCompletionRequest.model_validate(CHAT).tool_use() is None


def test_a_json_schema_format_keeps_its_schema() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "point", "schema": schema, "strict": True}}
    got = ChatCompletionRequest.model_validate({**CHAT, "response_format": fmt}).format()
    assert got is not None and (got.type, got.name, got.strict) == ("json_schema", "point", True)
    assert json.loads(got.schema) == schema
    assert (
        ChatCompletionRequest.model_validate({**CHAT, "response_format": {"type": "text"}}).format() is None
    )


def test_a_tool_calling_history_is_taken() -> None:
    call = [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]
    messages = [
        *CHAT["messages"],
        {"role": "assistant", "content": None, "tool_calls": call},
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]
    got = chat_messages(ChatCompletionRequest.model_validate({**CHAT, "messages": messages}))
    assert got[1].tool_calls == (ToolCall("c1", "add", '{"a": 1}'),)
    assert (got[2].role, got[2].tool_call_id, got[2].content) == ("tool", "c1", "3")


def test_the_compatibility_table_names_every_declared_field() -> None:
    table = compat_table()
    fields = set(ChatCompletionRequest.model_fields) | set(CompletionRequest.model_fields)
    missing = [f for f in fields - {"max_completion_tokens"} if f"`{f}`" not in table]
    assert missing == []
