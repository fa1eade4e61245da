"""Settings of the verifiers: the sandbox's limits."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class VerifySettings(BaseSettings):
    """Limits of one sandboxed run of a model's code (``services.verify.sandbox``)."""

    model_config = SettingsConfigDict(env_prefix="CHIMERA_VERIFY_", extra="ignore", frozen=True)

    timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="wall-clock limit of one sandboxed run; the process group is killed past it",
    )
    cpu_s: int = Field(default=10, ge=1, le=600, description="CPU-time limit (RLIMIT_CPU) of one run")
    memory_mb: int = Field(
        default=1024, ge=64, le=65536, description="address-space limit (RLIMIT_AS) of one run, MiB"
    )
    file_mb: int = Field(
        default=16,
        ge=1,
        le=4096,
        description="largest file one run may write (RLIMIT_FSIZE), its captured output included, MiB",
    )
    max_output_chars: int = Field(
        default=4000, ge=100, le=1_000_000, description="stdout and stderr kept per run, each"
    )
    float_rel_tol: float = Field(
        default=1e-4, ge=0, le=0.1, description="relative tolerance when a numeric answer is matched"
    )
