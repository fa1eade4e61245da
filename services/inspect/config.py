"""Settings of ``chimera queue`` and ``chimera explain``: ``CHIMERA_INSPECT_<NAME>`` variables."""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import SettingsConfigDict

from services.common.config import CommonSettings
from services.policy.admission import DEFAULT_MAX_QUEUE_S


class InspectSettings(CommonSettings):
    model_config = SettingsConfigDict(env_prefix="CHIMERA_INSPECT_", extra="ignore", frozen=True)

    limit: int = Field(default=50, ge=1, le=100_000, description="waiting requests shown per engine")
    program_limit: int = Field(default=200, ge=0, le=100_000, description="program-table rows shown")
    max_queue_s: float = Field(
        default=DEFAULT_MAX_QUEUE_S,
        ge=0,
        validation_alias=AliasChoices("CHIMERA_DISPATCHER_MAX_QUEUE_S", "max_queue_s"),
        description="the dispatcher's queue bound, to show how full each queue is (0: unbounded)",
    )
    engine_dead_after_s: float = Field(
        default=15.0, gt=0, description="an engine whose heartbeat is older than this is shown as dead"
    )
