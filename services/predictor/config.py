"""Predictor service settings (environment prefix ``CHIMERA_PREDICTOR_``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.common.model_service import ModelServiceSettings


class PredictorSettings(ModelServiceSettings):
    model_config = SettingsConfigDict(env_prefix="CHIMERA_PREDICTOR_", extra="ignore", frozen=True)

    port: int = Field(default=50062, ge=0, le=65535, description="gRPC port (0 picks a free one)")
    metrics_port: int = Field(
        default=9403, ge=0, le=65535, description="Prometheus /metrics port on host (0 picks a free one)"
    )
    artifact_dir: Path = Field(
        default=Path(".chimera/artifacts/predictor"),
        description="this service's artifact directory: <dir>/CURRENT names the version to serve",
    )
    max_request_items: int = Field(default=256, ge=1, description="rows one Predict call may carry")
