"""Router service settings (environment prefix ``CHIMERA_ROUTER_``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.common.model_service import ModelServiceSettings


class RouterSettings(ModelServiceSettings):
    model_config = SettingsConfigDict(env_prefix="CHIMERA_ROUTER_", extra="ignore", frozen=True)

    port: int = Field(default=50061, ge=0, le=65535, description="gRPC port (0 picks a free one)")
    metrics_port: int = Field(
        default=9402, ge=0, le=65535, description="Prometheus /metrics port on host (0 picks a free one)"
    )
    artifact_dir: Path = Field(
        default=Path(".chimera/artifacts/router"),
        description="this service's artifact directory: <dir>/CURRENT names the version to serve",
    )
    max_request_items: int = Field(default=256, ge=1, description="items one Score call may carry")
