"""Settings shared by every service. Each service's own ``config.py`` extends ``CommonSettings``.

Every knob reads from the environment and is validated at start-up, so a bad value stops the process
with a clear message instead of misbehaving. Service knobs are ``CHIMERA_<SERVICE>_<NAME>`` (each service
sets its own ``env_prefix``); the shared ones below are ``CHIMERA_<NAME>`` for every service.
"""

from __future__ import annotations

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.common.loop import EventLoop
from services.common.redis_cluster import CLUSTER_SCHEMES


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CHIMERA_", extra="ignore", frozen=True)

    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("CHIMERA_REDIS_URL", "redis_url"),
        description="Redis holding the queues and the program table; redis+cluster://host:port[,host:port] "
        "for a Redis Cluster",
    )
    key_prefix: str = Field(
        default="chimera",
        min_length=1,
        validation_alias=AliasChoices("CHIMERA_KEY_PREFIX", "key_prefix"),
        description="prefix of every Redis key",
    )
    redis_max_connections: int = Field(
        default=64,
        ge=2,
        le=10_000,
        validation_alias=AliasChoices("CHIMERA_REDIS_MAX_CONNECTIONS", "redis_max_connections"),
        description="connections a process keeps to Redis at most; more callers wait for one",
    )
    redis_outage_s: float = Field(
        default=15.0,
        ge=0.0,
        le=600.0,
        validation_alias=AliasChoices("CHIMERA_REDIS_OUTAGE_S", "redis_outage_s"),
        description="how long a Redis command keeps retrying through a lost connection (a restart) before "
        "it fails",
    )
    event_loop: EventLoop = Field(
        default="uvloop",
        validation_alias=AliasChoices("CHIMERA_EVENT_LOOP", "event_loop"),
        description="uvloop (the C event loop, cheaper per wakeup) or asyncio (the standard one, for "
        "debugging)",
    )
    log_level: str = Field(
        default="INFO",
        validation_alias=AliasChoices("CHIMERA_LOG_LEVEL", "log_level"),
        description="DEBUG, INFO, WARNING or ERROR",
    )

    @field_validator("redis_url")
    @classmethod
    def _known_scheme(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("redis://", "rediss://", "unix://", *CLUSTER_SCHEMES)):
            raise ValueError(
                "redis_url must start with redis://, rediss://, unix://, redis+cluster:// or rediss+cluster://"
            )
        return v
