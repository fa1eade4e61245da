"""Measure an engine's decode step-time curve: the profile the load balancer's cost model runs on.

NOTE(profiling): the curve is measured through the Engine interface, exactly as the worker drives the
engine, so it includes what the worker will see (detokenisation, output streaming). At each batch size b,
b requests decode together; a sequence's decode time per token (its wall time from first to last output,
over its generated tokens after the first) is the engine's step time at batch b, because every running
sequence gets one token per step. Prompts are distinct so prefix caching cannot flatter prefill.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from services.common.keys import Keys, ProfileField
from services.common.types import ChatMessage, EngineProfile, SamplingParams, StageRequest
from services.worker.engine.base import Engine, EngineRequestError

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# The quick first profile a new engine gets before it takes work: one sequence and a full batch, a few
# tokens each, measured once (seconds, where the whole curve takes minutes on a small CPU). The worker
# measures the whole curve later, while its engine is idle (services.worker.refine).
QUICK_TOKENS = 16
QUICK_ROUNDS = 1
QUICK_PREFILL_WORDS = 128


def quick_batch_sizes(max_num_seqs: int) -> tuple[int, ...]:
    return tuple(sorted({1, max(1, max_num_seqs)}))


# A prompt that keeps an instruction-tuned model talking; random models ignore it and run to max_tokens.
LONG_ANSWER = "Write a long, detailed essay with many sections about {topic}. Do not stop early."
TOPICS = (
    "the history of bridges",
    "how tides work",
    "the life cycle of stars",
    "medieval trade routes",
    "the chemistry of bread",
    "the design of sailing ships",
    "how compilers work",
    "the ecology of coral reefs",
)
FILLER = "The quick brown fox jumps over the lazy dog while the committee reviews the quarterly report. "


@dataclass(frozen=True, slots=True)
class ProfileProgress:
    done: int  # measurement rounds finished
    total: int
    batch_size: int
    step_ms: float


@dataclass(frozen=True, slots=True)
class _Run:
    ttft_s: float
    decode_ms_per_token: float | None  # None when it produced fewer than two tokens
    prompt_tokens: int
    completion_tokens: int


def _request(text: str, max_tokens: int, seed: int) -> StageRequest:
    rid = f"profile-{uuid.uuid4().hex[:12]}"
    return StageRequest(
        request_id=rid,
        program_id=rid,
        stage=0,
        workflow="profile",
        messages=(ChatMessage("user", text),),
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, seed=seed),
    )


async def _run_one(engine: Engine, request: StageRequest) -> _Run:
    start = time.perf_counter()
    first: float | None = None
    async for out in engine.generate(request, request.request_id, priority=0):
        now = time.perf_counter()
        if first is None and (out.text_delta or out.finished):
            first = now
        if out.finished:
            t_first = first if first is not None else now
            per_token = (
                (now - t_first) * 1000.0 / (out.completion_tokens - 1) if out.completion_tokens > 1 else None
            )
            return _Run(t_first - start, per_token, out.prompt_tokens, out.completion_tokens)
    raise RuntimeError(f"engine {engine.model} ended request {request.request_id} without a final output")


async def _decode_round(engine: Engine, batch: int, tokens: int, round_no: int) -> float:
    """Median per-sequence decode ms/token with ``batch`` sequences decoding together."""
    reqs = [
        _request(f"[{round_no}-{i}] " + LONG_ANSWER.format(topic=TOPICS[i % len(TOPICS)]), tokens, i)
        for i in range(batch)
    ]
    runs = await asyncio.gather(*(_run_one(engine, r) for r in reqs))
    per_token = [r.decode_ms_per_token for r in runs if r.decode_ms_per_token is not None]
    if not per_token:
        raise RuntimeError(f"no sequence of batch {batch} produced two tokens: raise `tokens`")
    return statistics.median(per_token)


async def prefill_ms_per_token(engine: Engine, long_words: int) -> float:
    """Extra time to first token per extra prompt token, from one short and one long prompt at batch 1."""
    short = await _run_one(engine, _request(f"[{uuid.uuid4().hex}] Say hi.", 1, 0))
    long: _Run | None = None
    while long is None:
        long_text = f"[{uuid.uuid4().hex}] " + FILLER * max(1, long_words // 16) + "Summarise."
        try:
            long = await _run_one(engine, _request(long_text, 1, 0))
        except EngineRequestError:  # longer than the engine's context: halve it
            if long_words < 32:
                return 0.0
            long_words //= 2
    extra = long.prompt_tokens - short.prompt_tokens
    if extra <= 0:
        return 0.0
    return max(0.0, (long.ttft_s - short.ttft_s) * 1000.0 / extra)


def monotone_curve(step_ms: Sequence[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """The measured curve made non-decreasing in batch size by a suffix minimum.

    A bigger batch never decodes a step faster on real hardware, and interference from other processes
    only ever adds time, so a point above a later one is contention: the later, lower time is the better
    estimate of both.
    """
    out: list[tuple[int, float]] = []
    low = float("inf")
    for b, t in sorted(step_ms, reverse=True):
        low = min(low, t)
        out.append((b, low))
    return tuple(reversed(out))


def effective_max_batch(step_ms: Sequence[tuple[int, float]], cap: int, min_gain: float = 0.1) -> int:
    """The batch size beyond which throughput (b / step time) stops improving by at least ``min_gain``.

    Pure function of the measured curve: walks up the batch sizes and stops at the first one whose next
    measured point gains less than ``min_gain`` throughput; never above ``cap`` (the engine's max_num_seqs).
    """
    pts = sorted((b, t) for b, t in step_ms if b <= cap and t > 0)
    if not pts:
        return max(1, cap)
    best = pts[0][0]
    for (b0, t0), (b1, t1) in zip(pts, pts[1:], strict=False):
        if b1 / t1 < (1.0 + min_gain) * (b0 / t0):
            break
        best = b1
    return min(best, cap)


async def profile_engine(
    engine: Engine,
    batch_sizes: Iterable[int] = DEFAULT_BATCH_SIZES,
    tokens: int = 64,
    rounds: int = 2,
    prefill_words: int = 384,
    min_gain: float = 0.1,
    progress: Callable[[ProfileProgress], None] | None = None,
) -> EngineProfile:
    """Drive a started engine at increasing concurrency and return its measured profile.

    ``tokens`` is max_tokens per request (more gives steadier numbers); each batch size is measured
    ``rounds`` times and the median kept. Batch sizes above ``engine.max_num_seqs`` are skipped: beyond it
    requests wait in the engine and the step time no longer describes a batch.
    """
    sizes = profile_sizes(engine, batch_sizes)
    await _run_one(engine, _request("Warm up.", 4, 0))  # first-call costs are not step time
    curve: list[tuple[int, float]] = []
    for i, b in enumerate(sizes):
        step = await measure_batch(engine, b, tokens, rounds)
        curve.append((b, step))
        if progress is not None:
            progress(ProfileProgress(i + 1, len(sizes), b, step))
    prefill = await prefill_ms_per_token(engine, prefill_words)
    return build_profile(engine, curve, prefill, min_gain)


def profile_sizes(engine: Engine, batch_sizes: Iterable[int] = DEFAULT_BATCH_SIZES) -> list[int]:
    """The batch sizes worth measuring: those the engine can run at once (beyond max_num_seqs requests wait
    in the engine and the step time no longer describes a batch)."""
    return sorted({b for b in batch_sizes if 1 <= b <= engine.max_num_seqs}) or [1]


async def measure_batch(engine: Engine, batch: int, tokens: int = 64, rounds: int = 2) -> float:
    """The engine's decode step time (ms) with ``batch`` sequences together: the median of ``rounds``."""
    samples = [await _decode_round(engine, batch, tokens, r) for r in range(rounds)]
    step = round(statistics.median(samples), 4)
    log.info("profile %s: batch %d step %.2f ms", engine.model, batch, step)
    return step


def build_profile(
    engine: Engine, curve: Sequence[tuple[int, float]], prefill_ms: float, min_gain: float = 0.1
) -> EngineProfile:
    """The profile of a measured curve (made monotone) and prefill cost, with how the engine ran."""
    smooth = monotone_curve(curve)
    if smooth != tuple(curve):
        log.info("profile %s: raw curve %s made monotone: %s", engine.model, list(curve), smooth)
    prefill = prefill_ms
    # Only in-process engines know how they run (dtype, threads); the others leave it empty.
    setup: dict[str, str] = getattr(engine, "setup", None) or {}
    return EngineProfile(
        decode_ms_per_token=smooth[0][1],
        max_batch_size=effective_max_batch(smooth, engine.max_num_seqs, min_gain),
        prefill_ms_per_token=round(prefill, 4),
        step_ms=smooth,
        dtype=setup.get("dtype", ""),
        threads=setup.get("threads", ""),
        cpu=setup.get("cpu", ""),
    )


async def quick_profile(
    engine: Engine, progress: Callable[[ProfileProgress], None] | None = None
) -> EngineProfile:
    """The first profile of a new engine, in seconds: batch 1 and a full batch, ``QUICK_TOKENS`` each,
    marked incomplete so that the whole curve replaces it once measured."""
    profile = await profile_engine(
        engine,
        quick_batch_sizes(engine.max_num_seqs),
        tokens=QUICK_TOKENS,
        rounds=QUICK_ROUNDS,
        prefill_words=QUICK_PREFILL_WORDS,
        progress=progress,
    )
    return replace(profile, complete=False)


async def store_profile(
    redis: Any, keys: Keys, engine_id: str, profile: EngineProfile, json_dir: Path | None = None
) -> Path | None:
    """Publish ``profile`` where workers read it (HASH ``keys.profile``) and, if asked, as a JSON file.

    ``redis`` is a ``redis.asyncio.Redis``. The scalar fields are duplicates of the JSON for ``redis-cli``.
    """
    await redis.hset(
        keys.profile(engine_id),
        mapping={
            ProfileField.JSON: profile.to_json(),
            ProfileField.DECODE_MS_PER_TOKEN: profile.decode_ms_per_token,
            ProfileField.MAX_BATCH_SIZE: profile.max_batch_size,
            ProfileField.PREFILL_MS_PER_TOKEN: profile.prefill_ms_per_token,
            ProfileField.MEASURED_UNIX: time.time(),
        },
    )
    return write_profile_json(json_dir, engine_id, profile)


def write_profile_json(json_dir: Path | None, engine_id: str, profile: EngineProfile) -> Path | None:
    """Write ``<json_dir>/<engine_id>.json`` atomically (nothing when ``json_dir`` is None)."""
    if json_dir is None:
        return None
    json_dir.mkdir(parents=True, exist_ok=True)
    path = json_dir / f"{engine_id}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(profile.to_json() + "\n")
    tmp.replace(path)
    return path


async def load_profile(redis: Any, keys: Keys, engine_id: str) -> EngineProfile | None:
    raw = await redis.hget(keys.profile(engine_id), ProfileField.JSON)
    return EngineProfile.from_json(raw) if raw else None


async def profile_and_store(
    engine: Engine,
    redis: Any,
    keys: Keys,
    engine_id: str,
    json_dir: Path | None = None,
    **profile_kw: Any,
) -> EngineProfile:
    """Start ``engine``, profile it, publish the profile, stop it: the body of ``chimera profile``.

    For an in-process vLLM engine call this from a process that may spawn children (a CLI, or a Celery
    worker with ``--pool=solo``/``threads``): prefork pool children are daemonic and cannot start vLLM's
    engine-core process.
    """
    await engine.start()
    try:
        profile = await profile_engine(engine, **profile_kw)
    finally:
        await engine.stop()
    await store_profile(redis, keys, engine_id, profile, json_dir)
    log.info("profile of %s (%s): %s", engine_id, engine.model, profile.to_json())
    return profile
