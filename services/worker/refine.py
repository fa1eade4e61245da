"""The rest of an engine's profile, measured while it is idle: the whole curve that replaces a quick one.

NOTE(refine): a new engine takes work after a quick profile (two batch sizes, a few tokens: seconds) so that
a first start is not held back for minutes. The load balancer's cost model wants the whole step-time curve,
so the worker measures it here, one batch size at a time and only once its engine has had nothing to do for
``idle_s``. A real request claimed while a point is being measured shares the engine with it, so that point
is thrown away and measured again at the next idle spell: real work is never queued behind profiling, and a
busy engine simply keeps its quick profile longer. The finished profile is stored
(``Keys.profile``) and published in the engine's info hash, where the next dispatch decision reads it.

The Celery profiling job (services.jobs.profile) measures an engine that is not serving; this measures one
that is, without a second copy of the model beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from services.common.keys import Keys
from services.common.types import EngineProfile
from services.worker.engine.base import Engine
from services.worker.profiling import (
    build_profile,
    measure_batch,
    prefill_ms_per_token,
    profile_sizes,
    store_profile,
)

log = logging.getLogger(__name__)

PREFILL_WORDS = 384


class ProfileRefiner:
    """Measures the whole curve of ``engine`` in its idle spells and hands the profile to ``publish``.

    ``idle_for``: seconds since the worker last held a request (0 while it holds one); ``activity``: a
    counter that moves whenever the worker claims (its claims so far)."""

    def __init__(
        self,
        engine: Engine,
        redis: Any,
        keys: Keys,
        engine_id: str,
        idle_for: Callable[[], float],
        activity: Callable[[], int],
        publish: Callable[[EngineProfile], Awaitable[None]],
        idle_s: float = 5.0,
        tokens: int = 64,
        rounds: int = 2,
    ) -> None:
        self._engine = engine
        self._r = redis
        self._keys = keys
        self._engine_id = engine_id
        self._idle_for = idle_for
        self._activity = activity
        self._publish = publish
        self._idle_s = idle_s
        self._tokens = tokens
        self._rounds = rounds
        self.discarded = 0  # points thrown away because real work overlapped them

    async def run(self, closing: asyncio.Event) -> EngineProfile | None:
        """Measure until done (the profile, stored and published) or until ``closing`` (None)."""
        todo = profile_sizes(self._engine)
        curve: dict[int, float] = {}
        prefill: float | None = None
        started = time.monotonic()
        while not closing.is_set():
            if not await self._idle_spell(closing):
                return None
            marker = self._activity()
            if todo:
                b = todo[0]
                value = await measure_batch(self._engine, b, self._tokens, self._rounds)
            else:
                value = await prefill_ms_per_token(self._engine, PREFILL_WORDS)
            if self._activity() != marker or self._idle_for() == 0.0:
                self.discarded += 1
                log.info("profile refinement: real work overlapped the measurement; measuring it again")
                continue
            if todo:
                curve[todo.pop(0)] = value
                continue
            prefill = value
            break
        if prefill is None:
            return None
        profile = build_profile(self._engine, sorted(curve.items()), prefill)
        await store_profile(self._r, self._keys, self._engine_id, profile)
        await self._publish(profile)
        log.info(
            "profile of %s refined in %.0f s (%d points discarded for real work): %s",
            self._engine_id,
            time.monotonic() - started,
            self.discarded,
            profile.to_json(),
        )
        return profile

    async def _idle_spell(self, closing: asyncio.Event) -> bool:
        """Wait until the engine has been idle ``idle_s``; False if the worker closes first."""
        while not closing.is_set():
            wait = self._idle_s - self._idle_for()
            if wait <= 0:
                return True
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(wait, 0.1)):
                    await closing.wait()
        return False
