"""Worker settings: ``CHIMERA_WORKER_<NAME>`` environment variables (plus the shared ``CHIMERA_*`` ones)."""

from __future__ import annotations

import os
import socket
import uuid
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from services.common.config import CommonSettings
from services.common.types import EngineProfile
from services.worker.options import WorkerOptions


class WorkerSettings(CommonSettings):
    # "none" in the environment is None: the only way to hand an optional setting (the KV cache size) back
    # to the engine's own sizing.
    model_config = SettingsConfigDict(
        env_prefix="CHIMERA_WORKER_", extra="ignore", frozen=True, env_parse_none_str="none"
    )

    engine_id: str = Field(
        default="e0", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="engine id; also its Redis hash tag"
    )
    model: str = Field(default="sim-model", min_length=1, description="model name the dispatcher routes by")
    engine_kind: Literal["simulated", "vllm", "remote"] = Field(
        default="simulated",
        description="engine implementation: simulated (a measuring instrument), vllm (in-process), remote",
    )
    max_num_seqs: int = Field(default=16, ge=1, le=4096, description="sequences the engine runs at once")
    prefetch: int = Field(
        default=2,
        ge=0,
        le=256,
        description="claims held beyond max_num_seqs, so a freed slot is refilled at once",
    )
    lease_s: float = Field(
        default=10.0, ge=0.5, le=3600.0, description="claim lease; a dead worker's work returns after it"
    )
    grace_s: float = Field(
        default=30.0, ge=0.0, le=3600.0, description="on SIGTERM, how long running requests may finish"
    )
    heartbeat_s: float = Field(
        default=1.0, gt=0.0, le=60.0, description="how often heartbeat_ms is refreshed"
    )
    claim_wait_s: float = Field(
        default=0.5, gt=0.0, le=30.0, description="longest idle wait for the queue's doorbell"
    )
    max_run_s: float = Field(
        default=3600.0, gt=0, le=7 * 86_400, description="a request running longer than this is aborted"
    )
    publish_interval_s: float = Field(
        default=0.05,
        gt=0.0,
        le=5.0,
        description="streamed text is flushed this often (a request's first text at once)",
    )
    tool_parser: str = Field(
        default="",
        description="vLLM's tool parser for this engine's model, by the name vllm serve --tool-call-parser "
        'takes ("hermes" for Qwen2.5, "llama3_json", ...); "" refuses a request that lets it call tools',
    )
    stream_tokens: int = Field(
        default=4,
        ge=1,
        le=256,
        description="real engines send a request's text every this many tokens (its first token at once); "
        "above 1 cuts the worker's per-token work (vLLM's stream_interval)",
    )
    publish_chars: int = Field(
        default=65536, ge=1, description="flush sooner once this many characters wait, all requests together"
    )
    metrics_host: str = Field(default="127.0.0.1", min_length=1, description="interface /metrics binds")
    metrics_port: int = Field(
        default=9404, ge=0, le=65535, description="Prometheus /metrics port (0 picks a free one, logged)"
    )
    worker_id: str = Field(
        default="", max_length=200, description="worker identity in claims; empty: host-pid-random"
    )
    time_scale: float = Field(
        default=1.0,
        gt=0.0,
        le=1e6,
        description="simulated engine only: runs this many times faster than its profile",
    )
    profile_json: str | None = Field(
        default=None,
        description="simulated engine only: EngineProfile JSON; default: the measured-style profile",
    )
    sim_length_median: float = Field(
        default=180.0, gt=0.0, description="simulated engine: median output tokens"
    )
    sim_length_sigma: float = Field(
        default=0.83, ge=0.0, le=5.0, description="simulated engine: lognormal sigma"
    )
    sim_seed: int = Field(default=0, description="simulated engine: seed of the output-length model")
    sim_fault_die_after_s: float | None = Field(
        default=None,
        gt=0.0,
        description="FAULT INJECTION (tests), simulated engine: it dies this long after start",
    )
    sim_fault_die_file: str = Field(
        default="",
        max_length=4096,
        description="FAULT INJECTION (tests), simulated engine: dies once this file appears (then removed)",
    )
    model_path: str = Field(
        default="tiny",
        description="vllm: model folder, or tiny | small | smollm2 | gemma3-270m | qwen2.5-coder-0.5b | "
        "qwen2.5-coder-1.5b (built or assembled and converted locally, once)",
    )
    max_model_len: int = Field(
        default=2048, ge=64, le=1_048_576, description="context length (the simulated engine stops there too)"
    )
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        default="auto",
        description="vllm: weight and activation dtype; auto: bfloat16 on a GPU or a CPU with AVX-512 BF16"
        " or AMX, float32 on any other CPU (emulated bf16 is several times slower there)",
    )
    kv_cache_gib: float | None = Field(
        default=1.0, gt=0, description="vllm: KV cache GiB; none: vLLM sizes it (gpu_memory_utilization)"
    )
    enforce_eager: bool | None = Field(
        default=None, description="vllm: unset = eager on CPU, CUDA graphs on GPU"
    )
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0, le=1, description="vllm on GPU: share of GPU memory the engine may use"
    )
    remote_url: str = Field(default="", description="remote: OpenAI-compatible server base URL, without /v1")
    remote_send_priority: bool = Field(
        default=True,
        description="remote: send the queue priority (server needs --scheduling-policy priority)",
    )
    profile_on_start: bool = Field(
        default=True,
        description="a real engine with no stored profile gets a quick one at start (two batch sizes,"
        " seconds) before it takes work",
    )
    refine_idle_s: float = Field(
        default=5.0,
        ge=0,
        description="after a quick profile, the whole curve is measured once the engine has been idle this"
        " long, and replaces it (0: never)",
    )
    max_attempts: int = Field(
        default=3,
        ge=1,
        le=100,
        description="a request running in this many distinct worker deaths is failed as poison",
    )

    @field_validator("profile_json")
    @classmethod
    def _valid_profile(cls, v: str | None) -> str | None:
        if v:
            try:
                EngineProfile.from_json(v)
            except (ValueError, TypeError, KeyError) as exc:
                raise ValueError(f"profile_json is not an EngineProfile: {exc}") from exc
        return v or None

    def profile(self) -> EngineProfile | None:
        return EngineProfile.from_json(self.profile_json) if self.profile_json else None

    def options(self) -> WorkerOptions:
        wid = self.worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        return WorkerOptions(
            engine_id=self.engine_id,
            kind=self.engine_kind,
            worker_id=wid,
            prefetch=self.prefetch,
            lease_s=self.lease_s,
            grace_s=self.grace_s,
            heartbeat_s=self.heartbeat_s,
            claim_wait_s=self.claim_wait_s,
            publish_interval_s=self.publish_interval_s,
            max_run_s=self.max_run_s,
            publish_chars=self.publish_chars,
            profile_on_start=self.profile_on_start,
            refine_idle_s=self.refine_idle_s,
            max_attempts=self.max_attempts,
        )
