"""First models for a pool that has no recorded traces yet.

NOTE(bootstrap): the router and the predictor learn from traces, and a fresh deployment has none. Until
the live system has recorded its own (``chimera train`` / the Celery retrain task replace these artifacts),
each engine is trained on traces from the workload's outcome model for its ``stand_in`` paper model
(``services.workload.outcome``: a seeded model calibrated to the paper's published statistics, not a
measurement of the engine). Rows carry the engine's own model name, so the services need no special case.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from services.common import artifacts
from services.common.tracestore import write_jsonl
from services.launcher.pool import PoolSpec
from services.predictor.training import train_predictor
from services.router.training import train_router
from services.workload.corpus import embedded_corpus, load_corpus
from services.workload.generate import Binding, generate
from services.workload.outcome import OutcomeModel

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ArtifactDirs:
    router: Path
    predictor: Path


def bindings(pool: PoolSpec) -> list[Binding]:
    """One binding per model (engines of the same model share its traces)."""
    seen: dict[str, Binding] = {}
    for e in pool.engines:
        seen.setdefault(e.model, Binding(engine=e.id, model=e.model, stand_in=e.stand_in or e.model))
    return list(seen.values())


def ensure_artifacts(
    pool: PoolSpec, root: Path, workflows: int, seed: int, embedded: bool = False
) -> ArtifactDirs:
    """Train bootstrap artifacts under ``root`` unless both services already have a current version
    that knows every model of the pool."""
    dirs = ArtifactDirs(router=root / "router", predictor=root / "predictor")
    if _covers(dirs.router, pool) and _covers(dirs.predictor, pool):
        return dirs
    corpus = embedded_corpus() if embedded else load_corpus()
    binds = bindings(pool)
    outcome_model = OutcomeModel(corpus.problems, models=[b.stand_in for b in binds])
    programs = list(generate(corpus.problems, outcome_model, binds, workflows, seed))
    traces = [t for p in programs for t in p.traces]
    outcomes = [p.outcome for p in programs]
    trace_dir = root.parent / "traces" / "bootstrap"
    write_jsonl(trace_dir / "traces.jsonl", traces)
    write_jsonl(trace_dir / "outcomes.jsonl", outcomes)
    log.info(
        "bootstrap: %d workflows (%d stages) from the outcome model on a %s corpus of %d problems",
        len(programs),
        len(traces),
        corpus.origin,
        len(corpus.problems),
    )
    router = train_router(traces, outcomes, root)
    predictor = train_predictor(traces, root)
    log.info(
        "bootstrap artifacts: router %s %s, predictor %s %s",
        router.version,
        router.metrics,
        predictor.version,
        predictor.metrics,
    )
    return dirs


def _covers(kind_dir: Path, pool: PoolSpec) -> bool:
    version = artifacts.current_version(kind_dir)
    if version is None:
        return False
    known = set(artifacts.load_meta(kind_dir, version).models)
    missing = set(pool.models) - known
    if missing:
        # A retrained version that lacks a model (e.g. labels for one engine only) is replaced by a fresh
        # bootstrap here; say so, since the operator's trained router stops serving.
        log.warning(
            "%s: current version %s knows no %s of this pool; training a bootstrap version to replace it"
            " (the old version stays in the folder)",
            kind_dir,
            version,
            sorted(missing),
        )
    return not missing
