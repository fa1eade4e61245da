"""Train a predictor backend from trace rows and publish it as a new artifact version.

Called by ``chimera train predictor`` and by the retraining Celery task; both pass plain rows.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from services.common import artifacts
from services.common.tokens import approx_tokens
from services.common.tracestore import held_out, remaining_tokens
from services.common.types import TraceRow
from services.predictor.backends import make_backend
from services.predictor.features import PredictorInput
from services.predictor.loops import LoopForest, LoopMoment
from services.predictor.qrf import QrfPredictor

log = logging.getLogger(__name__)

ArrayLike = Sequence[float] | npt.NDArray[np.float64]
PredictFn = Callable[[Sequence[PredictorInput], Sequence[float]], npt.NDArray[np.float64]]

KIND = "predictor"
# Pairwise metrics are O(n^2) in memory: larger per-model test sets are subsampled (seeded) to this size.
MAX_PAIRWISE_ROWS = 3000


def kendall_tau_distance(true: ArrayLike, order_key: ArrayLike, seed: int = 0) -> float | None:
    """Share of pairs that ``order_key`` puts in the wrong order relative to ``true`` (paper Table 3).

    Pairs tied in ``true`` are skipped (any order of them is right); pairs tied in ``order_key`` only count
    half, the expected error of a random tie-break. 0 is the oracle order, about 0.5 a random one.
    None when fewer than two distinct true values exist.
    """
    t = np.asarray(true, dtype=np.float64)
    k = np.asarray(order_key, dtype=np.float64)
    if len(t) > MAX_PAIRWISE_ROWS:
        idx = np.random.default_rng(seed).choice(len(t), MAX_PAIRWISE_ROWS, replace=False)
        t, k = t[idx], k[idx]
    dt = np.sign(t[:, None] - t[None, :])
    dk = np.sign(k[:, None] - k[None, :])
    mask = np.triu(np.ones(dt.shape, dtype=bool), 1) & (dt != 0)
    if not mask.any():
        return None
    wrong = (dt * dk < 0).astype(np.float64) + 0.5 * (dk == 0)
    return float(wrong[mask].mean())


def _arrival(rows: Sequence[TraceRow]) -> npt.NDArray[np.float64]:
    """FCFS order key: enqueue time, falling back to record order when none was recorded."""
    times = np.array([r.enqueued_unix for r in rows], dtype=np.float64)
    return times if np.any(times > 0) else np.arange(len(rows), dtype=np.float64)


def evaluate(
    backend_predict: PredictFn, rows: Sequence[TraceRow], targets: Sequence[int]
) -> dict[str, dict[str, float | None]]:
    """Per model: Kendall-tau distance of the predicted median, FCFS and input length; p90 coverage."""
    out: dict[str, dict[str, float | None]] = {}
    for m in sorted({r.model for r in rows}):
        idx = [i for i, r in enumerate(rows) if r.model == m]
        sub = [rows[i] for i in idx]
        y = [float(targets[i]) for i in idx]
        pred = backend_predict([PredictorInput.from_trace(r) for r in sub], (0.5, 0.9))
        out[m] = {
            "rows": float(len(sub)),
            "kendall_tau_distance": kendall_tau_distance(y, pred[:, 0]),
            "kendall_tau_distance_fcfs": kendall_tau_distance(y, _arrival(sub)),
            "kendall_tau_distance_input_length": kendall_tau_distance(
                y, [approx_tokens(r.prompt_text) for r in sub]
            ),
            "p90_coverage": float(np.mean(np.asarray(y) <= pred[:, 1])),
        }
    return out


def _mean(per_model: dict[str, dict[str, float | None]], key: str) -> float | None:
    vals = [v[key] for v in per_model.values() if v.get(key) is not None]
    return float(np.mean([v for v in vals if v is not None])) if vals else None


def predictor_data_hash(traces: Sequence[TraceRow], loops: Sequence[LoopMoment] = ()) -> str:
    """The ``data_hash`` a predictor artifact records for these rows (lets a retrain job skip a no-op)."""
    rows = [t.to_json() for t in traces] + [json.dumps(asdict(m), sort_keys=True) for m in loops]
    return artifacts.data_hash(rows)


def train_predictor(
    traces: Sequence[TraceRow],
    out_dir: Path,
    backend: str = "qrf",
    holdout: float = 0.2,
    make_current: bool = True,
    loops: Sequence[LoopMoment] = (),
) -> artifacts.ArtifactMeta:
    """Fit ``backend`` and publish it under ``out_dir / "predictor"``; returns the new version's metadata.

    ``out_dir`` is the artifacts root shared with the router. Targets are computed on all traces before the
    split, so a held-out stage's target still counts its program's later stages. The published model is the
    one fitted on the training programs, i.e. the one the held-out metrics describe.

    ``loops``: recorded agent loops (``services.predictor.loops``); the qrf backend then also serves the
    stages of open loops from a forest fitted on all of them (``bench/results/agent_loops.md`` holds its
    held-out figures, by problem).
    """
    if not 0.0 <= holdout < 1.0:
        raise ValueError("holdout must be in [0, 1)")
    targets = remaining_tokens(traces)
    # By task text: a program's stages share it, and no task is on both sides under another model.
    is_test = [bool(holdout) and held_out(r.user_text, holdout) for r in traces]
    train = [r for r, t in zip(traces, is_test, strict=True) if not t]
    test = [r for r, t in zip(traces, is_test, strict=True) if t]
    test_y = [y for y, t in zip(targets, is_test, strict=True) if t]
    model = make_backend(backend)
    model.fit(train)
    if loops:
        if not isinstance(model, QrfPredictor):
            raise ValueError(f"the {backend} backend has no forest for open loops; use qrf")
        model.loops = LoopForest().fit(loops)
    per_model = evaluate(model.predict, test, test_y) if test else {}
    metrics: dict[str, Any] = {
        "train_rows": len(train),
        "test_rows": len(test),
        "per_model": per_model,
        "kendall_tau_distance": _mean(per_model, "kendall_tau_distance"),
        "kendall_tau_distance_fcfs": _mean(per_model, "kendall_tau_distance_fcfs"),
        "kendall_tau_distance_input_length": _mean(per_model, "kendall_tau_distance_input_length"),
        "loop_moments": len(loops),
    }
    meta = artifacts.publish(
        out_dir / KIND,
        model,
        kind=KIND,
        backend=model.name,
        data_hash=predictor_data_hash(traces, loops),
        rows=len(traces),
        models=model.models,
        metrics=metrics,
        make_current=make_current,
    )
    log.info(
        "predictor %s (%s): Kendall-tau distance %s vs FCFS %s",
        meta.version,
        model.name,
        metrics["kendall_tau_distance"],
        metrics["kendall_tau_distance_fcfs"],
    )
    return meta
