"""Settings shared by every service. Each service's own ``config.py`` extends ``CommonSettings``.

Every knob reads from the environment and is validated at start-up, so a bad value stops the process
with a clear message instead of misbehaving. Service knobs are ``CHIMERA_<SERVICE>_<NAME>`` (each service
sets its own ``env_prefix``); the shared ones below are ``CHIMERA_<NAME>`` for every service.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CHIMERA_", extra="ignore", frozen=True)

    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("CHIMERA_REDIS_URL", "redis_url"),
        description="Redis holding the queues and the program table",
    )
    key_prefix: str = Field(
        default="chimera",
        min_length=1,
        validation_alias=AliasChoices("CHIMERA_KEY_PREFIX", "key_prefix"),
        description="prefix of every Redis key",
    )
    log_level: str = Field(
        default="INFO",
        validation_alias=AliasChoices("CHIMERA_LOG_LEVEL", "log_level"),
        description="DEBUG, INFO, WARNING or ERROR",
    )

    @field_validator("redis_url")
    @classmethod
    def _known_scheme(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("redis_url must start with redis://, rediss:// or unix://")
        return v


class ModelServiceSettings(CommonSettings):
    """Knobs shared by the model services (router, predictor); each sets its env prefix and defaults."""

    host: str = Field(default="127.0.0.1", min_length=1, description="address the gRPC server binds")
    port: int = Field(default=0, ge=0, le=65535, description="gRPC port (0 picks a free one)")
    metrics_port: int = Field(
        default=0, ge=0, le=65535, description="Prometheus /metrics port on host (0 picks a free one)"
    )
    artifact_dir: Path = Field(
        default=Path(".chimera/artifacts/model"),
        description="this service's artifact directory: <dir>/CURRENT names the version to serve",
    )
    max_batch_size: int = Field(default=32, ge=1, le=4096, description="items per inference batch, at most")
    max_wait_ms: float = Field(
        default=5.0, ge=0.0, le=10_000.0, description="a batch closes this long after its first item arrives"
    )
    pool_workers: int = Field(
        default=1, ge=1, le=64, description="inference worker processes (batches run at once)"
    )
    reload_interval_s: float = Field(
        default=2.0, gt=0.0, le=3600.0, description="how often CURRENT is checked"
    )
    max_request_items: int = Field(default=256, ge=1, description="items one call may carry")
    grace_s: float = Field(
        default=5.0, ge=0.0, le=300.0, description="drain time for in-flight calls on shutdown"
    )
