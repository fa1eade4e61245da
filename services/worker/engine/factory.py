"""Builds the engine a worker serves from its settings: the one place that knows every engine kind."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from services.common.startup import NoStartupReport, Phase, StartupSink
from services.worker.engine.base import Engine
from services.worker.engine.simulated import SimulatedEngine
from services.worker.engine.simulated_inputs import LognormalLengths, measured_style_profile

if TYPE_CHECKING:
    from services.worker.config import WorkerSettings


def _simulated(s: WorkerSettings, startup: StartupSink) -> Engine:
    profile = s.profile() or measured_style_profile(max_batch_size=s.max_num_seqs)
    lengths = LognormalLengths(median_tokens=s.sim_length_median, sigma=s.sim_length_sigma, seed=s.sim_seed)
    return SimulatedEngine(
        s.model,
        profile,
        s.max_num_seqs,
        s.time_scale,
        lengths,
        fault_die_after_s=s.sim_fault_die_after_s,
        stream_tokens=s.stream_tokens,
        fault_die_file=s.sim_fault_die_file,
        max_model_len=s.max_model_len,
    )


def _vllm(s: WorkerSettings, startup: StartupSink) -> Engine:
    # Imported here: vLLM and torch take seconds to import and only real-engine workers need them. Said
    # first, so a launcher sees this start move before the import's silence (over 8 s on a loaded 2-core CI).
    startup.report(Phase.STARTING, "importing vLLM and torch")
    from services.worker.engine.vllm_engine import VllmEngine, VllmEngineConfig, machine_dtype
    from services.worker.models import resolve_model

    return VllmEngine(
        VllmEngineConfig(
            model_path=str(resolve_model(s.model_path, startup=startup)),
            model=s.model,
            max_model_len=s.max_model_len,
            max_num_seqs=s.max_num_seqs,
            dtype=machine_dtype(s.dtype),
            kv_cache_gib=s.kv_cache_gib,
            enforce_eager=s.enforce_eager,
            gpu_memory_utilization=s.gpu_memory_utilization,
            stream_tokens=s.stream_tokens,
            tool_parser=s.tool_parser,
        )
    )


def _remote(s: WorkerSettings, startup: StartupSink) -> Engine:
    from services.worker.engine.remote import RemoteEngine, RemoteEngineConfig

    if not s.remote_url:
        raise ValueError("engine_kind=remote needs CHIMERA_WORKER_REMOTE_URL")
    return RemoteEngine(
        RemoteEngineConfig(
            base_url=s.remote_url,
            model=s.model,
            max_num_seqs=s.max_num_seqs,
            send_priority=s.remote_send_priority,
            stream_tokens=s.stream_tokens,
        )
    )


ENGINES: dict[str, Callable[[WorkerSettings, StartupSink], Engine]] = {
    "simulated": _simulated,
    "vllm": _vllm,
    "remote": _remote,
}


def build_engine(settings: WorkerSettings, startup: StartupSink | None = None) -> Engine:
    """The engine of kind ``settings.engine_kind``; ValueError naming the known kinds otherwise.
    ``startup`` hears each step of getting the weights ready (fetch, assembly, conversion)."""
    try:
        make = ENGINES[settings.engine_kind]
    except KeyError:
        known = ", ".join(sorted(ENGINES))
        raise ValueError(f"unknown engine kind {settings.engine_kind!r}; known kinds: {known}") from None
    return make(settings, startup or NoStartupReport())
