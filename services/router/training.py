"""Train a router backend from traces and outcomes and publish it as a new artifact version.

Called by ``chimera train router`` and by the retraining Celery task; both pass plain rows.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import average_precision_score

from services.common import artifacts
from services.common.tracestore import held_out
from services.common.types import OutcomeRow, TraceRow
from services.router.backends import RouterBackend, RouterExample, make_backend, router_examples
from services.router.prior import PriorRouter

log = logging.getLogger(__name__)

KIND = "router"


def macro_map(
    backend: RouterBackend, examples: Sequence[RouterExample]
) -> tuple[float | None, dict[str, float]]:
    """Macro mean average precision over models (success = outcome >= 0.5), and the per-model APs.

    A model is left out when its held-out labels are all one class (AP undefined); None when none is left.
    """
    if not examples:
        return None, {}
    proba = backend.predict_proba([e.text for e in examples], [e.workflow for e in examples])
    column = {m: i for i, m in enumerate(backend.models)}
    per_model: dict[str, float] = {}
    for m in sorted({e.model for e in examples}):
        idx = [i for i, e in enumerate(examples) if e.model == m]
        if m not in column:
            continue
        labels = np.array([examples[i].outcome >= 0.5 for i in idx], dtype=np.int8)
        if labels.min() == labels.max():
            continue
        per_model[m] = float(average_precision_score(labels, proba[idx, column[m]]))
    if not per_model:
        return None, {}
    return float(np.mean(list(per_model.values()))), per_model


def router_data_hash(traces: Sequence[TraceRow], outcomes: Sequence[OutcomeRow]) -> str:
    """The ``data_hash`` a router artifact records for these rows (lets a retrain job skip a no-op)."""
    return artifacts.data_hash([t.to_json() for t in traces] + [o.to_json() for o in outcomes])


def train_router(
    traces: Sequence[TraceRow],
    outcomes: Sequence[OutcomeRow],
    out_dir: Path,
    backend: str = "tfidf",
    holdout: float = 0.2,
    make_current: bool = True,
) -> artifacts.ArtifactMeta:
    """Fit ``backend`` and publish it under ``out_dir / "router"``; returns the new version's metadata.

    ``out_dir`` is the artifacts root shared with the predictor. With ``holdout > 0`` the model is fitted on
    the other tasks and the held-out ones give ``metrics`` (macro mAP, and the same for the text-blind
    per-model prior, the floor to beat); the published model is the one those metrics describe.
    """
    if not 0.0 <= holdout < 1.0:
        raise ValueError("holdout must be in [0, 1)")
    examples = router_examples(traces, outcomes)
    test_ids = {e.program_id for e in examples if holdout and held_out(e.text, holdout)}
    train_out = [o for o in outcomes if o.program_id not in test_ids]
    test = [e for e in examples if e.program_id in test_ids]
    model = make_backend(backend)
    model.fit(traces, train_out)
    floor = PriorRouter(per_workflow=False)
    floor.fit(traces, train_out)
    score, per_model = macro_map(model, test)
    floor_score, _ = macro_map(floor, test)
    metrics: dict[str, Any] = {
        "train_examples": len(examples) - len(test),
        "test_examples": len(test),
        "macro_map": score,
        "macro_map_prior_only": floor_score,
        "ap_per_model": per_model,
    }
    meta = artifacts.publish(
        out_dir / KIND,
        model,
        kind=KIND,
        backend=model.name,
        data_hash=router_data_hash(traces, outcomes),
        rows=len(examples),
        models=model.models,
        metrics=metrics,
        make_current=make_current,
    )
    log.info("router %s (%s): macro mAP %s vs prior-only %s", meta.version, model.name, score, floor_score)
    return meta
