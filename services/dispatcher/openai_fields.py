"""The OpenAI request fields the HTTP door knows but cannot honour yet, each refused by name, and what it does
with the fields it honours.

"The model's default" is what ``vllm serve`` uses for a field a request leaves unset: the model's
generation config (``generation_config.json``), else vLLM's neutral value (OpenAI's 1.0 for temperature).

NOTE(no silent drops): a client that sets ``tools`` or ``response_format`` and gets plain text back has been
lied to; one that gets a 400 naming the field knows at once. So every such field is declared on the request
models (services.dispatcher.openai_schema) and accepted only at its neutral value (absent, null, or what
OpenAI documents as its default: ``tool_choice: "none"``, ``presence_penalty: 0``, ``logprobs: false``, ...);
any other value is a 400 whose ``param`` is the field. Unknown fields (not in OpenAI's API at all) are still
ignored, as OpenAI's own server does. ``compat_table`` lists what each door does with every field, for the
README (``chimera docs``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from services.dispatcher.validate import MAX_STOP_SEQUENCES


def _none(v: Any) -> bool:
    return v is None


def _false(v: Any) -> bool:
    return v is None or v is False


def _zero(v: Any) -> bool:
    return v is None or v == 0


def _one(v: Any) -> bool:
    return v is None or v == 1


def _empty(v: Any) -> bool:
    return v is None or v == [] or v == {}


def _text_only(v: Any) -> bool:
    return v is None or v == ["text"]


@dataclass(frozen=True, slots=True)
class Refused:
    neutral: Callable[[Any], bool]
    accepts: str  # the neutral values, as the error message names them


CHAT_REFUSED: Mapping[str, Refused] = {
    "functions": Refused(_empty, "absent"),
    "function_call": Refused(lambda v: v is None or v == "none", 'absent or "none"'),
    "logprobs": Refused(_false, "absent or false"),
    "top_logprobs": Refused(_zero, "absent or 0"),
    "prediction": Refused(_none, "absent"),
    "audio": Refused(_none, "absent"),
    "modalities": Refused(_text_only, 'absent or ["text"]'),
}
TEXT_REFUSED: Mapping[str, Refused] = {
    "logprobs": Refused(_zero, "absent or 0"),
    "echo": Refused(_false, "absent or false"),
    "best_of": Refused(_one, "absent or 1"),
    "suffix": Refused(_none, "absent"),
}
# Sampling fields vLLM has and Chimera does not pass on yet: both endpoints of the HTTP API.
SAMPLING_REFUSED: Mapping[str, Refused] = {
    "logit_bias": Refused(_empty, "absent or {}"),
}


def check_refused(table: Mapping[str, Refused], name: str, value: Any) -> Any:
    """``value`` if it is ``name``'s neutral value; else the ValueError that becomes a 400 naming it."""
    rule = table[name]
    if not rule.neutral(value):
        raise ValueError(f"not supported by Chimera yet; only {rule.accepts} is accepted")
    return value


# Fields honoured, per endpoint, with what the door does with each (one line of the compatibility table).
HONOURED: Mapping[str, tuple[str, str]] = {
    "model": ("both", '"auto" lets Chimera choose; a served model name pins the workflow to it'),
    "messages": (
        "chat",
        "system (and developer), user, assistant and tool turns; text content parts are joined; an"
        " assistant turn's `tool_calls` and a tool turn's `tool_call_id` go to the chat template",
    ),
    "prompt": ("text", "a string or a list of one string"),
    "max_tokens": (
        "both",
        "the stage's token limit (`max_completion_tokens` too, on chat); unset: up to the end of the"
        " model's context, as vllm serve",
    ),
    "temperature": ("both", "sampling temperature; unset or null: the model's default (as vllm serve)"),
    "top_p": ("both", "nucleus sampling; unset or null: the model's default"),
    "top_k": ("both", "vLLM's top-k (0 or -1: off); unset or null: the model's default"),
    "min_p": ("both", "vLLM's min-p; unset or null: the model's default"),
    "presence_penalty": ("both", "in [-2, 2]; unset or null: the model's default"),
    "frequency_penalty": ("both", "in [-2, 2]; unset or null: the model's default"),
    "repetition_penalty": ("both", "vLLM's, in (0, 2]; unset or null: the model's default"),
    "seed": ("both", "per-request sampling seed"),
    "stop": ("both", f"up to {MAX_STOP_SEQUENCES} stop strings"),
    "n": ("both", "1 only: a stage has one answer (n > 1 is a 400)"),
    "stream": ("both", "server-sent events, one delta per relay chunk; tool-call pieces stream as deltas"),
    "stream_options": ("both", "`include_usage` adds the usage chunk"),
    "metadata": ("both", "`program_id`, `stage`, `workflow`: the workflow identity (headers win)"),
    "prompt_cache_key": ("both", "a session id: one program across calls, after headers and metadata"),
    "tools": (
        "chat",
        "function tools: rendered by the model's chat template, calls read back by the engine's vLLM tool"
        " parser (`tool_parser` in the pool file); an engine without one answers a 400",
    ),
    "tool_choice": (
        "chat",
        '"auto", "none", "required" or a named function; required and named are enforced by vLLM\'s'
        " structured outputs, as `vllm serve` enforces them",
    ),
    "parallel_tool_calls": ("chat", "passed to vLLM (false: at most one call)"),
    "response_format": ("chat", '"text", "json_object", "json_schema" (strict too): vLLM structured outputs'),
}


def compat_table() -> str:
    """The README's table: every field the HTTP door knows, per endpoint, honoured or refused."""
    rows = [f"| `{name}` | {where} | honoured | {what} |" for name, (where, what) in HONOURED.items()]
    refused: dict[str, list[tuple[str, str]]] = {}
    for where, table in (("chat", CHAT_REFUSED), ("text", TEXT_REFUSED), ("both", SAMPLING_REFUSED)):
        for name, rule in table.items():
            refused.setdefault(name, []).append((where, rule.accepts))
    for name, places in refused.items():
        where = " and ".join(w for w, _ in places) if len(places) > 1 else places[0][0]
        accepts = "; ".join(f"{w}: {a}" if len(places) > 1 else a for w, a in places)
        rows.append(f"| `{name}` | {where} | refused (400, `param` names it) | accepted only as {accepts} |")
    header = ["| field | endpoint | Chimera | what it does |", "|---|---|---|---|"]
    return "\n".join(header + rows)
