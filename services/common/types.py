"""Typed, frozen data contracts that cross service boundaries.

Protobuf messages are converted to these at the gRPC edge (each service's ``server.py``) and nowhere else;
Redis holds them as JSON produced by ``to_json``/``from_json`` here, so every reader agrees on the shape.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from services.common.chat import ResponseFormat, ToolCall, ToolUse, tool_calls_of

Role = Literal["system", "user", "assistant", "tool"]
ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str
    # An assistant turn's calls, and the call a "tool" turn answers: a tool-calling history as it goes back.
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ChatMessage:
        return ChatMessage(**{**d, "tool_calls": tool_calls_of(d.get("tool_calls"))})


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """None: the engine's default for its model (a vLLM engine's generation config, as ``vllm serve``
    applies it; a remote server's own), else vLLM's neutral value."""

    max_tokens: int = 256
    # An HTTP caller gave no max_tokens: the engine generates up to the end of the model's context, as vllm
    # serve does, and max_tokens (the dispatcher's default) is only the bound its estimates use (the last
    # stage's prediction cap, a tenant's token charge), so those are unchanged by it.
    to_context: bool = False
    temperature: float | None = 0.0
    top_p: float | None = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_k: int | None = None  # 0 or -1: off
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None


@dataclass(frozen=True, slots=True)
class LoopState:
    """Where an open agent loop stands when its next stage waits: what the predictor of open loops reads
    (``services.predictor.loops``), all of it known before the stage runs."""

    turn: int  # the stage index
    attained_tokens: int  # output tokens of the program's finished stages
    last_tool_failed: bool  # the tool results this stage answers include a failure
    last_tool_chars: int  # their length, in characters
    last_output_tokens: int  # the previous stage's output tokens (0 on a first stage)


@dataclass(frozen=True, slots=True)
class StageRequest:
    """One stage of one workflow, as validated by the front door."""

    request_id: str
    program_id: str
    stage: int
    workflow: str
    messages: tuple[ChatMessage, ...]
    sampling: SamplingParams
    # A model name the client pinned, or None to let the policy choose.
    model_pin: str | None = None
    # Absolute unix time after which the request is useless to the caller; None means no deadline.
    deadline_unix: float | None = None
    # When the front door accepted it: end-to-end time is measured from here.
    received_unix: float = 0.0
    # The workflow ends with this stage (an HTTP request without a program): all that remains of it is this
    # stage's output, so its predicted remaining tokens are at most max_tokens.
    last_stage: bool = False
    tool_use: ToolUse | None = None
    response_format: ResponseFormat | None = None
    # Its caller reads the text as it is produced. False (HTTP stream=false, gRPC final_only, the SDK's
    # generate()): the engine is asked for the whole answer and only the final event is written, so no
    # per-token work is spent on text nobody reads as it comes.
    stream: bool = True
    # How its program was found: a client's id, a session id, the conversation it continues, or none
    # (services.dispatcher.intake.IdentitySource). The decision record keeps it for `chimera explain`.
    identity: str = "header"
    # Set on a stage of an open agent loop (a program nobody named that offers or answers tools): the
    # predictor then predicts from the loop's state, not from a workflow it does not have.
    loop: LoopState | None = None
    # How long its program's tool pause may keep its predicted remaining work in the engine's load: the
    # program row's idle TTL (services.common.pause_scripts); 0: no pause is kept.
    pause_ttl_s: float = 0.0

    def system_text(self) -> str:
        return "\n".join(m.content for m in self.messages if m.role == "system")

    def user_text(self) -> str:
        """The task text: the first user message. Router input and the predictor's text sketch."""
        return next((m.content for m in self.messages if m.role == "user"), "")

    def prompt_text(self) -> str:
        """The whole stage input, history included (what the engine prefills)."""
        return "\n".join(m.content for m in self.messages)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @staticmethod
    def from_json(raw: str | bytes) -> StageRequest:
        d = json.loads(raw)
        d["messages"] = tuple(ChatMessage.from_dict(m) for m in d["messages"])
        s = d["sampling"]
        s["stop"] = tuple(s.get("stop", ()))
        d["sampling"] = SamplingParams(**s)
        if d.get("tool_use") is not None:
            d["tool_use"] = ToolUse.from_dict(d["tool_use"])
        if d.get("response_format") is not None:
            d["response_format"] = ResponseFormat(**d["response_format"])
        if d.get("loop") is not None:
            d["loop"] = LoopState(**d["loop"])
        return StageRequest(**d)


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """How fast an engine decodes, as measured by ``chimera profile`` (never typed in by hand)."""

    decode_ms_per_token: float
    max_batch_size: int
    prefill_ms_per_token: float = 0.0
    # (batch size, decode step time in ms) points of the measured curve, ascending by batch size.
    step_ms: tuple[tuple[int, float], ...] = ()
    # How the engine ran while measured (an in-process vLLM engine says; others leave them empty): its
    # dtype, its OpenMP binding (``VLLM_CPU_OMP_THREADS_BIND`` x threads) and the CPU's vector extensions.
    dtype: str = ""
    threads: str = ""
    cpu: str = ""
    # False for the quick first profile a worker measures at start (two batch sizes, a few tokens): the
    # worker measures the whole curve once its engine is idle and replaces it (services.worker.refine).
    complete: bool = True

    def step_time_ms(self, batch: int) -> float:
        """Decode step time at ``batch`` sequences, interpolated linearly on the measured curve."""
        if not self.step_ms:
            return self.decode_ms_per_token
        pts = self.step_ms
        if batch <= pts[0][0]:
            return pts[0][1]
        for (b0, t0), (b1, t1) in zip(pts, pts[1:], strict=False):
            if batch <= b1:
                return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)
        (b0, t0), (b1, t1) = pts[-2:] if len(pts) > 1 else (pts[0], pts[0])
        slope = (t1 - t0) / (b1 - b0) if b1 != b0 else 0.0
        return t1 + slope * (batch - b1)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @staticmethod
    def from_json(raw: str | bytes) -> EngineProfile:
        d = json.loads(raw)
        d["step_ms"] = tuple((int(b), float(t)) for b, t in d.get("step_ms", ()))
        return EngineProfile(**d)


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """What the load balancer sees of one engine at decision time."""

    engine_id: str
    model: str
    profile: EngineProfile
    # Sum of predicted remaining tokens of every request dispatched to it and not yet finished.
    inflight_tokens: int
    queued: int = 0
    running: int = 0
    alive: bool = True
    # Predicted tokens its finished, failed and cancelled requests have released so far (a counter): its
    # rate is how fast the engine's queue drains.
    drained_tokens: int = 0
    calls_tools: bool = True  # it reads tool calls out of its answers (EngineField.TOOLS)


@dataclass(frozen=True, slots=True)
class Prediction:
    """Predicted total remaining output tokens of the workflow (this stage and all later ones)."""

    p50: int
    p90: int


@dataclass(frozen=True, slots=True)
class DispatchTimings:
    """Where one request's dispatch time went, in ms (the paper's Table 1 split: router, predictor, and the
    scheduler, which is the policy plus its Redis round trips)."""

    router_ms: float = 0.0
    predictor_ms: float = 0.0
    policy_ms: float = 0.0
    redis_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class ClaimedRequest:
    """A request a worker has popped: it holds the lease for ``attempt`` until it completes or dies."""

    engine: str
    request: StageRequest
    predicted: int
    predicted_p90: int
    attempt: int
    enqueued_unix: float
    claimed_unix: float
    # When its first attempt was claimed: the queue wait a caller saw ends there, whatever ran after.
    first_claimed_unix: float = 0.0

    @property
    def queue_wait_s(self) -> float:
        return max(0.0, (self.first_claimed_unix or self.claimed_unix) - self.enqueued_unix)


@dataclass(frozen=True, slots=True)
class StageResult:
    """What an engine produced for one request."""

    text: str
    finish_reason: str  # "stop" | "length" | "cancelled" | "tool_calls"
    prompt_tokens: int
    completion_tokens: int
    tool_calls: tuple[ToolCall, ...] = ()
    cached_tokens: int = 0  # prompt tokens the engine's prefix cache held


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One completed stage, recorded for retraining the router and the predictor.

    The workload generator writes rows of exactly this shape, so training cannot tell recorded traces from
    generated ones. The remaining-workflow target is derived at training time by summing
    ``completion_tokens`` of this and later stages of the same program.
    """

    request_id: str
    program_id: str
    workflow: str
    stage: int
    engine: str
    model: str
    system_text: str
    user_text: str
    prompt_text: str
    prompt_tokens: int
    completion_tokens: int
    predicted: int
    predicted_p90: int
    queue_wait_s: float
    run_s: float
    finish_reason: str
    attempt: int = 1
    enqueued_unix: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @staticmethod
    def from_json(raw: str | bytes) -> TraceRow:
        return TraceRow(**json.loads(raw))


@dataclass(frozen=True, slots=True)
class OutcomeRow:
    """A finished workflow's score, joined with its stage traces by ``program_id`` at training time."""

    program_id: str
    workflow: str
    model: str
    engine: str
    outcome: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @staticmethod
    def from_json(raw: str | bytes) -> OutcomeRow:
        return OutcomeRow(**json.loads(raw))
