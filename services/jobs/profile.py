"""Profile an engine and publish the profile, through the worker's own profiling code.

The engine is built exactly as ``python -m services.worker`` builds it (``build_engine`` on worker
settings), so the measured curve is the one the worker will run at. A vLLM engine needs its accelerator
free: run this job where the GPU is and before that engine's worker starts (see the task's docstring).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.common.keys import Keys
from services.common.redis_client import connect_tool
from services.common.types import EngineProfile

if TYPE_CHECKING:
    from services.worker.profiling import ProfileProgress


async def profile_and_store(
    worker: Mapping[str, Any],
    redis_url: str | None,
    keys: Keys,
    json_dir: Path | None,
    tokens: int,
    rounds: int,
    batch_sizes: Sequence[int] | None,
    progress: Callable[[ProfileProgress], None] | None = None,
) -> EngineProfile:
    """Start the engine ``worker`` describes (WorkerSettings fields), measure it, store its profile
    (in Redis when ``redis_url`` is given, and as ``<engine>.json`` in ``json_dir`` when given)."""
    from services.worker.config import WorkerSettings  # the engine stack loads only in a profiling job
    from services.worker.engine.factory import build_engine
    from services.worker.profiling import (
        DEFAULT_BATCH_SIZES,
        profile_engine,
        store_profile,
        write_profile_json,
    )

    settings = WorkerSettings(**worker)
    engine = build_engine(settings)
    await engine.start()
    try:
        profile = await profile_engine(
            engine, batch_sizes or DEFAULT_BATCH_SIZES, tokens, rounds, progress=progress
        )
    finally:
        await engine.stop()
    if redis_url is None:
        write_profile_json(json_dir, settings.engine_id, profile)
        return profile
    redis = connect_tool(redis_url)
    try:
        await store_profile(redis, keys, settings.engine_id, profile, json_dir)
    finally:
        await redis.aclose()
    return profile
