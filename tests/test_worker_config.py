"""Worker settings and the engine factory: environment parsing, validation, unknown kinds."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.common.types import EngineProfile
from services.worker.config import WorkerSettings
from services.worker.engine.factory import build_engine
from services.worker.engine.simulated import SimulatedEngine

pytestmark = pytest.mark.unit


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    profile = EngineProfile(decode_ms_per_token=12.0, max_batch_size=8, step_ms=((1, 12.0), (8, 20.0)))
    monkeypatch.setenv("CHIMERA_WORKER_ENGINE_ID", "gpu-3")
    monkeypatch.setenv("CHIMERA_WORKER_MAX_NUM_SEQS", "8")
    monkeypatch.setenv("CHIMERA_WORKER_PREFETCH", "0")
    monkeypatch.setenv("CHIMERA_WORKER_TIME_SCALE", "25")
    monkeypatch.setenv("CHIMERA_WORKER_PROFILE_JSON", profile.to_json())
    monkeypatch.setenv("CHIMERA_KEY_PREFIX", "px")
    s = WorkerSettings()
    assert (s.engine_id, s.max_num_seqs, s.prefetch, s.key_prefix) == ("gpu-3", 8, 0, "px")
    opts = s.options()
    assert opts.engine_id == "gpu-3" and opts.prefetch == 0 and opts.lease_s == 10.0 and opts.worker_id
    engine = build_engine(s)
    assert isinstance(engine, SimulatedEngine)
    assert engine.profile() == profile and engine.max_num_seqs == 8 and engine.time_scale == 25


@pytest.mark.parametrize(("value", "expected"), [("none", None), ("2.5", 2.5)])
def test_kv_cache_size_can_be_handed_back_to_vllm_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: float | None
) -> None:
    # On a GPU the CPU-sized 1 GiB default would starve the batch; "none" lets vLLM size the cache.
    monkeypatch.setenv("CHIMERA_WORKER_KV_CACHE_GIB", value)
    assert WorkerSettings().kv_cache_gib == expected


def test_default_simulated_engine_uses_the_measured_style_profile() -> None:
    engine = build_engine(WorkerSettings(max_num_seqs=4))
    p = engine.profile()
    assert p is not None and p.decode_ms_per_token == 33.0 and p.max_batch_size == 4


@pytest.mark.parametrize(
    "field,value",
    [
        ("prefetch", -1),
        ("lease_s", 0.1),
        ("time_scale", 0),
        ("max_num_seqs", 0),
        ("engine_id", "a b"),
        ("profile_json", "{not json"),
    ],
)
def test_bad_values_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValidationError):
        WorkerSettings(**{field: value})  # type: ignore[arg-type]


def test_unknown_engine_kind_is_a_clear_error() -> None:
    with pytest.raises(ValidationError, match=r"(?s)engine_kind.*'simulated', 'vllm' or 'remote'"):
        WorkerSettings(engine_kind="tpu")  # type: ignore[arg-type]


def test_remote_engine_needs_a_url() -> None:
    with pytest.raises(ValueError, match="CHIMERA_WORKER_REMOTE_URL"):
        build_engine(WorkerSettings(engine_kind="remote"))
