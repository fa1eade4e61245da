"""The parts of a chat request beyond its text: tools, the caller's tool choice, a structured-output format,
and the tool calls an answer makes.

One typed form for both doors and every engine: the HTTP door and the gRPC door map their wire shapes into
these once (services.dispatcher), the engines map out of them once (services.worker.engine), and Redis holds
them inside a ``StageRequest``'s JSON. JSON Schemas and arguments stay JSON text, as OpenAI carries them:
nothing here interprets a schema, so nothing here can disagree with the engine that enforces it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

ToolChoiceMode = Literal["auto", "none", "required", "function"]
TOOL_CHOICE_MODES: frozenset[str] = frozenset({"auto", "none", "required", "function"})
FormatType = Literal["text", "json_object", "json_schema"]
FORMAT_TYPES: frozenset[str] = frozenset({"text", "json_object", "json_schema"})


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call an assistant made: in an answer, or in the history a caller sends back."""

    id: str
    name: str
    arguments: str  # a JSON object as text, as OpenAI carries it

    def openai(self) -> dict[str, Any]:
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}


@dataclass(frozen=True, slots=True)
class ToolCallPiece:
    """A streamed piece of tool call ``index`` of an answer: its id and name come with its first piece, its
    arguments in pieces that concatenate to the whole (OpenAI's ``delta.tool_calls[]``)."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""

    def wire(self) -> list[Any]:
        return [self.index, self.id, self.name, self.arguments]

    @staticmethod
    def from_wire(raw: list[Any]) -> ToolCallPiece:
        index, id_, name, arguments = raw
        return ToolCallPiece(int(index), str(id_), str(name), str(arguments))


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call."""

    name: str
    description: str = ""
    parameters: str = ""  # a JSON Schema of the arguments as text; "" means any object
    strict: bool = False

    def openai(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        if self.parameters:
            function["parameters"] = json.loads(self.parameters)
        if self.strict:
            function["strict"] = True
        return {"type": "function", "function": function}


@dataclass(frozen=True, slots=True)
class ToolUse:
    """The tools of one request and how the caller lets the model use them."""

    tools: tuple[Tool, ...]
    choice: ToolChoiceMode = "auto"
    function: str = ""  # the function a "function" choice forces
    parallel: bool = True

    def openai_choice(self) -> str | dict[str, Any]:
        if self.choice == "function":
            return {"type": "function", "function": {"name": self.function}}
        return self.choice

    @property
    def calls_possible(self) -> bool:
        return bool(self.tools) and self.choice != "none"

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ToolUse:
        return ToolUse(
            tools=tuple(Tool(**t) for t in d["tools"]),
            choice=d.get("choice", "auto"),
            function=d.get("function", ""),
            parallel=bool(d.get("parallel", True)),
        )


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """What shape the answer's text must have (OpenAI's ``response_format``)."""

    type: FormatType = "text"
    schema: str = ""  # json_schema: the JSON Schema as text
    name: str = ""
    strict: bool = False

    def openai(self) -> dict[str, Any]:
        if self.type != "json_schema":
            return {"type": self.type}
        spec: dict[str, Any] = {"name": self.name or "response", "schema": json.loads(self.schema or "{}")}
        if self.strict:
            spec["strict"] = True
        return {"type": "json_schema", "json_schema": spec}


def openai_tool_use(
    tools: tuple[Tool, ...], choice: str | None, function: str = "", parallel: bool | None = None
) -> ToolUse | None:
    """Tools and a choice as OpenAI defaults them: None when neither is given; an unset choice is "auto"
    with tools and "none" without; an unset ``parallel`` is true. ``function``: the named choice's."""
    if not tools and choice is None and not function:
        return None
    mode = "function" if function else choice or ("auto" if tools else "none")
    return ToolUse(tools, mode, function, parallel is not False)  # type: ignore[arg-type]


def merge_pieces(pieces: Sequence[ToolCallPiece]) -> tuple[ToolCallPiece, ...]:
    """Consecutive pieces of one tool call as one piece (fewer messages, the same call)."""
    out: list[ToolCallPiece] = []
    for p in pieces:
        last = out[-1] if out else None
        if last is not None and last.index == p.index and not p.id and not p.name:
            out[-1] = ToolCallPiece(last.index, last.id, last.name, last.arguments + p.arguments)
        else:
            out.append(p)
    return tuple(out)


def piece_chars(p: ToolCallPiece) -> int:
    """What a piece adds to an attempt's output position (``DeltaItem.end``)."""
    return len(p.id) + len(p.name) + len(p.arguments)


def tool_calls_of(raw: list[dict[str, Any]] | None) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(**c) for c in raw or ())
