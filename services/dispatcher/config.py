"""Dispatcher settings: ``CHIMERA_DISPATCHER_<NAME>`` variables (shared ones are ``CHIMERA_<NAME>``)."""

from __future__ import annotations

import functools
import os
import socket
from typing import Literal

from pydantic import Field, FilePath, ValidationInfo, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from services.common import tls
from services.common.config import CommonSettings
from services.common.tenants import TenantLimits
from services.dispatcher import validate as v
from services.dispatcher.auth import is_loopback
from services.policy.admission import DEFAULT_MAX_QUEUE_S, Bounds
from services.policy.knobs import DEFAULT_KNOBS, DEFAULT_POLICY, Knobs
from services.policy.registry import POLICIES


@functools.cache
def _host_pid() -> str:
    # Read once: every decision record carries the replica's name, and it cannot change in a running process.
    return f"{socket.gethostname()}:{os.getpid()}"


class DispatcherSettings(CommonSettings):
    model_config = SettingsConfigDict(env_prefix="CHIMERA_DISPATCHER_", extra="ignore", frozen=True)

    host: str = Field(default="127.0.0.1", min_length=1, description="interface the gRPC server binds")
    port: int = Field(default=50051, ge=0, le=65535, description="gRPC port; 0 picks a free one")
    http_host: str = Field(
        default="", description="interface the OpenAI-compatible HTTP server binds; empty means host"
    )
    http_port: int = Field(
        default=8000, ge=0, le=65535, description="OpenAI-compatible HTTP port; 0 picks one"
    )
    # NOTE(keepalive): uvicorn closes an idle connection after 5 s by default, and httpx's pool expires one
    # after the same 5 s, so a client could pick a connection just as the door closed it: 6 ReadErrors in
    # 6,830 requests at 256 in flight (bench.load.run, HTTP), none in 7,069 with 75 s. The door must outlast
    # the idle expiry of common client pools (httpx 5 s, aiohttp 15 s, Go 90 s), so the client closes first.
    http_keepalive_s: int = Field(
        default=120, ge=1, le=3600, description="seconds the HTTP door keeps an idle kept-alive connection"
    )
    metrics_port: int = Field(
        default=9401, ge=0, le=65535, description="Prometheus /metrics port on host (0 picks a free one)"
    )
    router_addr: str = Field(default="127.0.0.1:50061", min_length=3, description="router service host:port")
    predictor_addr: str = Field(
        default="127.0.0.1:50062", min_length=3, description="predictor service host:port"
    )
    router_timeout_s: float = Field(
        default=0.5,
        gt=0,
        le=60,
        description="per-call router deadline; past it the dispatch degrades to fastest",
    )
    predictor_timeout_s: float = Field(
        default=0.5,
        gt=0,
        le=60,
        description="per-call predictor deadline; past it max_tokens is the prediction",
    )
    # Remote by default: an existing deployment keeps its router and predictor services (and any transformer
    # backend, which never runs inline) until its operator opts in.
    inference: Literal["remote", "inline"] = Field(
        default="remote",
        description="where the router and predictor models run: remote (their gRPC services at router_addr "
        "and predictor_addr) or inline (in this process, from CHIMERA_ROUTER_ARTIFACT_DIR and "
        "CHIMERA_PREDICTOR_ARTIFACT_DIR, hot reloaded; CPU backends only: tfidf/prior, qrf/empirical)",
    )
    upstream_inflight: int = Field(
        default=2,
        ge=0,
        le=64,
        description="calls out at once to the router (and to the predictor); dispatches arriving meanwhile "
        "share the next call (0: one call per dispatch)",
    )
    # The policy knobs' defaults live with the policy (services.policy.knobs), which the simulator shares.
    policy: str = Field(
        default=DEFAULT_POLICY, description="scheduling policy name (services/policy/README.md)"
    )
    tau: float = Field(
        default=DEFAULT_KNOBS.tau,
        ge=0,
        description="latency slack: a more confident engine may be this much slower",
    )
    delta_s: float = Field(
        default=DEFAULT_KNOBS.delta_s,
        ge=0,
        le=1,
        description="confidence margin needed to leave the fastest engine",
    )
    escalate: bool = Field(
        default=DEFAULT_KNOBS.escalate,
        description="after a failed tool result, move the program's next stage to a stronger model when it "
        "pays (services/policy/README.md, escalation)",
    )
    escalation_tau: float | None = Field(
        default=DEFAULT_KNOBS.escalation_tau,
        ge=0,
        description="latency slack of an escalation: a move costs up to (1 + this) x staying (none: tau)",
    )
    aging_rate: float = Field(
        default=DEFAULT_KNOBS.aging_rate,
        gt=0,
        le=1e6,
        description="aging credit in tokens per second of waiting (anti-starvation)",
    )
    priority_cap_tokens: int = Field(
        default=DEFAULT_KNOBS.priority_cap_tokens,
        ge=1,
        description="predictions above this count as this much for priority (bounds the wait)",
    )
    max_queue_s: float = Field(
        default=DEFAULT_MAX_QUEUE_S,
        ge=0,
        le=86_400,
        description="predicted seconds of work an engine's queue may hold; a new workflow over it is "
        "browned out or refused (0: unbounded)",
    )
    brownout_margin: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="a full engine's new workflow may go to a model the router scores this much lower",
    )
    max_queue_wait_s: int = Field(
        default=3600,
        ge=1,
        le=7 * 86_400,
        description="a request waiting longer than this for an engine is dropped (one that runs never is)",
    )
    max_open_requests: int = Field(
        default=10_000,
        ge=1,
        description="requests one dispatcher process holds open; new workflows past it get 429",
    )
    door_headroom: int | None = Field(
        default=None,
        ge=1,
        description="calls each door (gRPC, HTTP) holds beyond max_open_requests before it answers 429 "
        "to any call; unset: max(256, max_open_requests / 4)",
    )
    program_ttl_s: int = Field(
        default=3600, ge=1, description="an idle program's assignment expires after this"
    )
    continuation: bool = Field(
        default=True,
        description="find the program of a request no client named by the conversation it continues (a "
        "digest of each answered conversation is kept conversation_ttl_s); off: each such request is a new "
        "program, routed afresh",
    )
    conversation_ttl_s: int = Field(
        default=600,
        ge=1,
        description="a program no client named (a session id, a continued conversation, a request without "
        "identity) is ended this long after its last answer; its continuation is awaited as long",
    )
    max_tokens_default: int = Field(
        default=256,
        ge=1,
        description="max_tokens of a gRPC request that sets none; for an HTTP request that sets none (which "
        "runs to the end of the model's context, as vllm serve), what the estimates take",
    )
    max_tokens_limit: int = Field(default=8192, ge=1, description="largest max_tokens a request may ask for")
    max_prompt_chars: int = Field(
        default=200_000,
        ge=1,
        description="largest prompt accepted: characters of all messages and stop sequences",
    )
    max_messages: int = Field(default=v.MAX_MESSAGES, ge=1, description="most messages one request may carry")
    max_stop_sequences: int = Field(
        default=v.MAX_STOP_SEQUENCES, ge=0, description="most stop sequences one request may carry"
    )
    max_stop_chars: int = Field(
        default=v.MAX_STOP_CHARS, ge=1, description="longest stop sequence, in characters"
    )
    max_workflow_chars: int = Field(
        default=v.MAX_WORKFLOW_CHARS, ge=1, description="longest workflow name (letters, digits and ._:/-)"
    )
    max_id_chars: int = Field(
        default=v.MAX_ID_CHARS,
        ge=8,
        le=1000,
        description="longest program or request id (letters, digits, ._:/@+=-: ids become Redis key names)",
    )
    max_stage: int = Field(
        default=v.MAX_STAGE, ge=0, le=2**31 - 1, description="largest stage index accepted"
    )
    max_stage_skip: int = Field(
        default=v.MAX_STAGE_SKIP,
        ge=0,
        description="how far a stage may run ahead of the one expected next (the program's last + 1, or 0 "
        "for a program the table does not hold: an expired row, a framework skipping branches)",
    )
    max_metadata_chars: int = Field(
        default=8192, ge=0, description="largest HTTP `metadata` object: characters of its keys and values"
    )
    max_body_bytes: int = Field(
        default=8 * 2**20,
        ge=1024,
        description="largest HTTP request body; a larger one is refused with 413 before it is parsed",
    )
    engine_dead_after_s: float = Field(
        default=15.0, gt=0, description="an engine whose heartbeat is older than this gets no new work"
    )
    replica: str = Field(
        default="",
        max_length=200,
        description="this dispatcher replica's name (logs, the reaper lease); empty: host:pid",
    )
    reaper_interval_s: float = Field(
        default=5.0, gt=0, le=3600, description="how often the dispatcher re-queues work of crashed workers"
    )
    stream_block_ms: int = Field(
        default=1000, ge=10, le=60_000, description="how long one read of the output streams waits"
    )
    stream_probe_s: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="a stream silent this long is read directly and its request checked for existence",
    )
    detach_grace_s: float = Field(
        default=3.0,
        ge=0,
        le=600,
        description="a caller that goes away has its request cancelled this much later, unless its retry "
        "re-attached to the request (same request_id) meanwhile",
    )
    grace_s: float = Field(default=5.0, ge=0, le=120, description="shutdown grace for in-flight calls")
    # Who may call (auth.py): "auto" asks for an API key unless both doors are bound to loopback only.
    auth: Literal["auto", "keys", "off"] = Field(
        default="auto",
        description="API keys on both doors: keys (always), auto (unless both doors listen on loopback "
        "only), off (loopback only; refused on any other interface)",
    )
    auth_cache_s: float = Field(
        default=5.0,
        ge=0,
        le=300,
        description="how long a key's record is cached; a revoked key keeps working at most this long",
    )
    # Tenant quotas and fair shares (quotas.py, services/policy/fairness.py); `chimera tenants set` overrides
    # them per tenant. Tenant "" (no authentication) has no limits unless one is set for it.
    tenant_max_workflows: int = Field(
        default=0,
        ge=0,
        description="live workflows a tenant may hold at once; a new one past it gets 429 (0: no limit)",
    )
    tenant_tokens_per_minute: int = Field(
        default=0,
        ge=0,
        description="tokens (prompt + max_tokens of each stage) a tenant may be charged over a sliding "
        "minute; past it 429 with the Retry-After when the stage fits (0: no limit)",
    )
    tenant_weight: int = Field(
        default=1, ge=1, le=1000, description="a tenant's fair-share weight in every engine's queue order"
    )
    fair_cap_tokens: int = Field(
        default=DEFAULT_KNOBS.fair_cap_tokens,
        ge=0,
        description="most tokens a tenant over its fair share of an engine is pushed back in the queue; the "
        "aging bound grows by at most this / aging_rate seconds (0: no fairness term)",
    )
    # Transport security (services/common/tls.py): each unset setting leaves its hop in plaintext.
    tls_cert_file: FilePath | None = Field(
        default=None, description="certificate chain (PEM) both doors (gRPC, HTTP) present; unset: plaintext"
    )
    tls_key_file: FilePath | None = Field(default=None, description="private key (PEM) of tls_cert_file")
    upstream_tls_ca_file: FilePath | None = Field(
        default=None,
        description="CA bundle (PEM) the router's and predictor's certificates must chain to; set: the "
        "dispatcher reaches them over TLS",
    )
    upstream_tls_cert_file: FilePath | None = Field(
        default=None, description="client certificate (PEM) shown to a router or predictor that asks (mTLS)"
    )
    upstream_tls_key_file: FilePath | None = Field(
        default=None, description="private key (PEM) of upstream_tls_cert_file"
    )
    upstream_tls_server_name: str = Field(
        default="",
        description="name the router's and predictor's certificates are checked against; empty: the host "
        "of router_addr / predictor_addr",
    )

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        if v not in POLICIES:
            raise ValueError(f"unknown policy {v!r}; known: {sorted(POLICIES)}")
        return v

    @field_validator("max_tokens_limit")
    @classmethod
    def _limit_covers_default(cls, v: int, info: ValidationInfo) -> int:
        default = info.data.get("max_tokens_default", 1)
        if v < default:
            raise ValueError("max_tokens_limit must be >= max_tokens_default")
        return v

    def replica_name(self) -> str:
        return self.replica or _host_pid()

    def door_hosts(self) -> tuple[str, str]:
        return self.host, self.http_host or self.host

    @model_validator(mode="after")
    def _open_only_on_loopback(self) -> DispatcherSettings:
        if self.auth == "off" and any(not is_loopback(h) for h in self.door_hosts()):
            raise ValueError(
                f"auth=off serves anyone who can reach {self.door_hosts()}: it is allowed on loopback only; "
                "use auth=keys (`chimera keys create`)"
            )
        return self

    @model_validator(mode="after")
    def _tls_complete(self) -> DispatcherSettings:
        tls.check_server(self.tls_cert_file, self.tls_key_file, env="CHIMERA_DISPATCHER_")
        tls.check_client(
            self.upstream_tls_cert_file, self.upstream_tls_key_file, env="CHIMERA_DISPATCHER_UPSTREAM_"
        )
        return self

    def door_limit(self) -> int:
        """Calls a door holds open at most (its ``DoorGate``); past it every call gets 429 /
        RESOURCE_EXHAUSTED with a Retry-After. The headroom above ``max_open_requests`` (which refuses new
        workflows first) is for the later stages of admitted workflows, which that bound lets in."""
        headroom = self.door_headroom or max(256, self.max_open_requests // 4)
        return self.max_open_requests + headroom

    def bounds(self) -> Bounds:
        """The admission bounds as the pure admission function takes them."""
        return Bounds(self.max_queue_s, self.brownout_margin)

    def limits(self) -> v.Limits:
        """The input limits as the pure checks of ``validate.py`` take them."""
        return v.Limits(
            max_tokens_limit=self.max_tokens_limit,
            max_prompt_chars=self.max_prompt_chars,
            max_messages=self.max_messages,
            max_stop_sequences=self.max_stop_sequences,
            max_stop_chars=self.max_stop_chars,
            max_workflow_chars=self.max_workflow_chars,
            max_id_chars=self.max_id_chars,
            max_stage=self.max_stage,
            max_stage_skip=self.max_stage_skip,
        )

    def knobs(self) -> Knobs:
        """The policy knobs as the pure policy functions take them."""
        return Knobs(
            self.tau,
            self.delta_s,
            self.aging_rate,
            self.priority_cap_tokens,
            self.fair_cap_tokens,
            self.escalate,
            self.escalation_tau,
        )

    def tenant_defaults(self) -> TenantLimits:
        """The quotas of a tenant without a record of its own."""
        return TenantLimits(self.tenant_max_workflows, self.tenant_tokens_per_minute, self.tenant_weight)
