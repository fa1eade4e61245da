"""Predictor service settings (environment prefix ``CHIMERA_PREDICTOR_``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.common.config import CommonSettings


class PredictorSettings(CommonSettings):
    model_config = SettingsConfigDict(env_prefix="CHIMERA_PREDICTOR_", extra="ignore", frozen=True)

    host: str = Field(default="127.0.0.1", min_length=1, description="address the gRPC server binds")
    port: int = Field(default=50062, ge=0, le=65535, description="gRPC port (0 picks a free one)")
    metrics_port: int = Field(
        default=9403, ge=0, le=65535, description="Prometheus /metrics port on host (0 picks a free one)"
    )
    artifact_dir: Path = Field(
        default=Path(".chimera/artifacts/predictor"),
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
    max_request_items: int = Field(default=256, ge=1, description="rows one Predict call may carry")
    grace_s: float = Field(
        default=5.0, ge=0.0, le=300.0, description="drain time for in-flight calls on shutdown"
    )
