"""Settings of the background-jobs worker (``CHIMERA_JOBS_<NAME>``).

Celery's broker and result keys live in their own Redis database (``/1`` by default, the dispatcher's state
is in ``/0``) *and* under their own key prefix, so that neither a ``FLUSHDB`` of one nor a ``SCAN`` of the
other ever touches the other's keys, even where an operator points both URLs at the same database.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from services.common.config import CommonSettings

_BROKER_SCHEMES = ("redis://", "rediss://", "redis+socket://", "memory://")
_BACKEND_SCHEMES = ("redis://", "rediss://", "redis+socket://", "cache+memory://")


class JobsSettings(CommonSettings):
    model_config = SettingsConfigDict(env_prefix="CHIMERA_JOBS_", extra="ignore", frozen=True)

    broker_url: str = Field(
        "redis://127.0.0.1:6379/1",
        description="Celery broker: a Redis database apart from the dispatcher's (or redis+socket://PATH)",
    )
    result_backend: str = Field(
        "redis://127.0.0.1:6379/1",
        description="where task results are kept (same URL forms as broker_url)",
    )
    celery_key_prefix: str = Field(
        "chimera-jobs:",
        min_length=1,
        pattern=r"^[A-Za-z0-9_.:-]+[:_.-]$",
        description="prefix of every broker and result key Celery writes (ends in a separator)",
    )
    queue: str = Field("chimera-jobs", min_length=1, description="Celery queue the jobs worker consumes")
    concurrency: int = Field(1, ge=1, le=64, description="worker processes (retraining is CPU-bound)")
    traces_dir: Path = Field(
        Path(".chimera/traces"),
        description="folder of exported JSONL (traces-<engine>.jsonl, outcomes.jsonl)",
    )
    export_batch: int = Field(1000, ge=1, le=100_000, description="stream entries read per XRANGE")
    export_lock_s: float = Field(
        600.0, gt=0, le=86_400, description="lease of the export lock; renewed after every batch"
    )
    export_interval_s: float = Field(
        60.0, ge=0, le=86_400, description="period of the scheduled trace export; 0 disables the schedule"
    )
    beat: bool = Field(
        True, description="run the periodic scheduler inside this worker (run exactly one such worker)"
    )
    retrain_interval_s: float = Field(
        3600.0, ge=0, le=7 * 86_400, description="period of the scheduled retrains; 0 disables them"
    )
    retrain_min_rows: int = Field(
        50, ge=1, description="fewest exported rows (router: outcomes, predictor: traces) worth a retrain"
    )
    retrain_lock_s: float = Field(
        3600.0, gt=0, le=86_400, description="lease of a retrain; longer than one training run"
    )
    router_backend: str | None = Field(
        None, min_length=1, description="router backend to retrain (None: the training code's default)"
    )
    predictor_backend: str | None = Field(
        None, min_length=1, description="predictor backend to retrain (None: the training code's default)"
    )
    profiles_dir: Path | None = Field(
        None, description="also write each measured profile as <engine>.json here (None: Redis only)"
    )
    state_dir: Path = Field(Path(".chimera/jobs"), description="worker-local state (the beat schedule file)")
    result_expires_s: int = Field(86_400, ge=60, description="how long task results are kept")

    @field_validator("broker_url")
    @classmethod
    def _broker_scheme(cls, v: str) -> str:
        if not v.startswith(_BROKER_SCHEMES):
            raise ValueError(f"broker_url must start with one of {', '.join(_BROKER_SCHEMES)}")
        return v

    @field_validator("result_backend")
    @classmethod
    def _backend_scheme(cls, v: str) -> str:
        if not v.startswith(_BACKEND_SCHEMES):
            raise ValueError(f"result_backend must start with one of {', '.join(_BACKEND_SCHEMES)}")
        return v
