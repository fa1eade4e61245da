"""Builds the engine a worker serves from its settings: the one place that knows every engine kind."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from services.worker.engine.base import Engine
from services.worker.engine.simulated import SimulatedEngine
from services.worker.engine.simulated_inputs import LognormalLengths, measured_style_profile

if TYPE_CHECKING:
    from services.worker.config import WorkerSettings


def _simulated(s: WorkerSettings) -> Engine:
    profile = s.profile() or measured_style_profile(max_batch_size=s.max_num_seqs)
    lengths = LognormalLengths(median_tokens=s.sim_length_median, sigma=s.sim_length_sigma, seed=s.sim_seed)
    return SimulatedEngine(s.model, profile, s.max_num_seqs, s.time_scale, lengths)


ENGINES: dict[str, Callable[[WorkerSettings], Engine]] = {"simulated": _simulated}


def build_engine(settings: WorkerSettings) -> Engine:
    """The engine of kind ``settings.engine_kind``; ValueError naming the known kinds otherwise."""
    try:
        make = ENGINES[settings.engine_kind]
    except KeyError:
        known = ", ".join(sorted(ENGINES))
        raise ValueError(f"unknown engine kind {settings.engine_kind!r}; known kinds: {known}") from None
    return make(settings)
