"""Retrain the router and the predictor from the exported JSONL, through the training code they own.

NOTE(retrain): retraining is idempotent by data: the training rows are hashed by the training modules' own
``router_data_hash`` / ``predictor_data_hash`` (what ``ArtifactMeta.data_hash`` records), and when
``CURRENT`` was already fitted on exactly these rows (with the requested backend) nothing is published. A
redelivered or repeated task therefore never stacks up identical versions; new rows (a later export) give a
new hash and a new version. The training modules are imported only when a retrain runs, so the jobs worker
starts without scikit-learn and friends.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from services.common import artifacts
from services.common.tracestore import read_trace_folder

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RetrainResult:
    kind: str
    rows: int  # training rows found (traces for the predictor, outcomes for the router)
    version: str | None  # the version published, None when skipped
    skipped: str | None = None  # why nothing was published


def _same_as_current(kind_dir: Path, data_hash: str, backend: str | None) -> str | None:
    version = artifacts.current_version(kind_dir)
    if version is None:
        return None
    meta = artifacts.load_meta(kind_dir, version)
    same = meta.data_hash == data_hash and backend in (None, meta.backend)
    return version if same else None


def retrain_router(
    traces_dir: Path, artifact_root: Path, backend: str | None, min_rows: int
) -> RetrainResult:
    from services.router import training

    traces, outcomes = read_trace_folder(traces_dir)
    if len(outcomes) < min_rows:
        return RetrainResult(training.KIND, len(outcomes), None, f"{len(outcomes)} outcomes < {min_rows}")
    current = _same_as_current(
        artifact_root / training.KIND, training.router_data_hash(traces, outcomes), backend
    )
    if current is not None:
        return RetrainResult(training.KIND, len(outcomes), None, f"{current} was fitted on these rows")
    if backend:
        meta = training.train_router(traces, outcomes, artifact_root, backend)
    else:
        meta = training.train_router(traces, outcomes, artifact_root)
    return RetrainResult(training.KIND, len(outcomes), meta.version)


def retrain_predictor(
    traces_dir: Path, artifact_root: Path, backend: str | None, min_rows: int
) -> RetrainResult:
    from services.predictor import training

    traces, _ = read_trace_folder(traces_dir)
    if len(traces) < min_rows:
        return RetrainResult(training.KIND, len(traces), None, f"{len(traces)} traces < {min_rows}")
    current = _same_as_current(artifact_root / training.KIND, training.predictor_data_hash(traces), backend)
    if current is not None:
        return RetrainResult(training.KIND, len(traces), None, f"{current} was fitted on these rows")
    if backend:
        meta = training.train_predictor(traces, artifact_root, backend)
    else:
        meta = training.train_predictor(traces, artifact_root)
    return RetrainResult(training.KIND, len(traces), meta.version)
