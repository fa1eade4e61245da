"""First models for a pool: trained on real verified traces where the repository has them, on synthetic ones
where it does not.

NOTE(bootstrap): the router and the predictor learn from traces, and a fresh deployment has recorded none.
Its first models learn from two sources, per model of the pool:

- **real** (``LauncherSettings.real_traces``, by default bench/data/real): verified workflows of that very
  model, collected through Chimera and checked by the sandboxed verifier. Rows count for a pool model when
  their ``model`` name is the engine's.
- **real loops** (``LauncherSettings.real_loops``, by default bench/data/agent/loops.jsonl): the coding
  agent's recorded loops on that model, which the predictor's forest of open loops learns from
  (``services.predictor.loops``); a model without them has its loops predicted as workflows.
- **synthetic**, only for a model no real trace covers: the workload's outcome model for the engine's
  ``stand_in`` paper model (``services.workload.outcome``: seeded and calibrated to the paper's published
  statistics, not a measurement of the engine). Rows carry the engine's own model name, so the services need
  no special case.

What each model was trained on is written beside the artifacts (``bootstrap.json``), so that a bootstrap
trained before real traces existed for a model is replaced once they do, while a version the operator
trained (``chimera train``, the Celery retrain task) is never touched.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from services.common import artifacts
from services.common.tracestore import read_trace_folder, write_jsonl
from services.common.types import OutcomeRow, TraceRow
from services.launcher.pool import PoolSpec
from services.predictor.loops import LoopMoment, loop_moments, read_loops
from services.predictor.training import train_predictor
from services.router.training import train_router
from services.workload.corpus import embedded_corpus, load_corpus
from services.workload.generate import Binding, generate
from services.workload.outcome import OutcomeModel

log = logging.getLogger(__name__)

PROVENANCE_FILE = "bootstrap.json"
# What a bootstrap is trained on: real workflows per model, the models left synthetic, real loops per model.
Plan = tuple[dict[str, int], tuple[str, ...], dict[str, int]]


@dataclass(frozen=True, slots=True)
class ArtifactDirs:
    router: Path
    predictor: Path


@dataclass(frozen=True, slots=True)
class Provenance:
    """What a bootstrap trained each model on: real workflows per model, and the models left synthetic."""

    real: dict[str, int] = field(default_factory=dict)  # model -> verified workflows
    synthetic: tuple[str, ...] = ()
    real_folder: str = ""
    router: str = ""  # the versions this bootstrap published
    predictor: str = ""
    loops: dict[str, int] = field(default_factory=dict)  # model -> recorded agent loops

    def plan(self) -> Plan:
        return self.real, self.synthetic, self.loops

    def describe(self) -> str:
        real = ", ".join(f"{m} ({n} real workflows)" for m, n in sorted(self.real.items()))
        synthetic = ", ".join(f"{m} (synthetic stand-in)" for m in self.synthetic)
        loops = ", ".join(f"{m} ({n} real agent loops)" for m, n in sorted(self.loops.items()))
        return "; ".join(p for p in (real, synthetic, loops) if p)


def bindings(pool: PoolSpec, models: set[str] | None = None) -> list[Binding]:
    """One binding per model (engines of the same model share its traces), only ``models`` if given."""
    seen: dict[str, Binding] = {}
    for e in pool.engines:
        if models is None or e.model in models:
            seen.setdefault(e.model, Binding(engine=e.id, model=e.model, stand_in=e.stand_in or e.model))
    return list(seen.values())


def real_rows(pool: PoolSpec, folder: Path | None) -> tuple[list[TraceRow], list[OutcomeRow]]:
    """The rows of ``folder`` for the pool's models whose workflows have a verified outcome."""
    if folder is None or not folder.is_dir():
        return [], []
    traces, outcomes = read_trace_folder(folder)
    models = set(pool.models)
    outcomes = [o for o in outcomes if o.model in models]
    labelled = {o.program_id for o in outcomes}
    return [t for t in traces if t.program_id in labelled], outcomes


def real_loops(pool: PoolSpec, path: Path | None) -> list[LoopMoment]:
    """Every turn of the recorded loops at ``path`` that ran on a model of the pool."""
    models = set(pool.models)
    return [m for m in loop_moments(read_loops(path)) if m.model in models] if path else []


def ensure_artifacts(
    pool: PoolSpec,
    root: Path,
    workflows: int,
    seed: int,
    embedded: bool = False,
    real_folder: Path | None = None,
    loops_file: Path | None = None,
) -> ArtifactDirs:
    """Train bootstrap artifacts under ``root`` unless both services already have a current version that
    knows every model of the pool and was not a bootstrap trained on less than is available now."""
    dirs = ArtifactDirs(router=root / "router", predictor=root / "predictor")
    traces, outcomes = real_rows(pool, real_folder)
    real = dict(Counter(o.model for o in outcomes))
    synthetic = tuple(m for m in pool.models if m not in real)
    moments = real_loops(pool, loops_file)
    loops = dict(Counter(m.model for m in moments if m.state.turn == 0))
    if _current(dirs, pool, root, (real, synthetic, loops)):
        return dirs
    if synthetic:
        corpus = embedded_corpus() if embedded else load_corpus()
        binds = bindings(pool, set(synthetic))
        outcome_model = OutcomeModel(corpus.problems, models=[b.stand_in for b in binds])
        programs = list(generate(corpus.problems, outcome_model, binds, workflows, seed))
        traces += [t for p in programs for t in p.traces]
        outcomes += [p.outcome for p in programs]
        log.info(
            "bootstrap: %d synthetic workflows for %s from the outcome model on a %s corpus of %d problems",
            len(programs),
            list(synthetic),
            corpus.origin,
            len(corpus.problems),
        )
    trace_dir = root.parent / "traces" / "bootstrap"
    write_jsonl(trace_dir / "traces.jsonl", traces)
    write_jsonl(trace_dir / "outcomes.jsonl", outcomes)
    router = train_router(traces, outcomes, root)
    predictor = train_predictor(traces, root, loops=moments)
    made = Provenance(real, synthetic, str(real_folder or ""), router.version, predictor.version, loops)
    (root / PROVENANCE_FILE).write_text(json.dumps(asdict(made), indent=1) + "\n")
    log.info("bootstrap trained on: %s", made.describe())
    log.info(
        "bootstrap artifacts: router %s %s, predictor %s %s",
        router.version,
        router.metrics,
        predictor.version,
        predictor.metrics,
    )
    return dirs


def read_provenance(root: Path) -> Provenance | None:
    try:
        raw = json.loads((root / PROVENANCE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return Provenance(
        real={str(k): int(v) for k, v in raw.get("real", {}).items()},
        synthetic=tuple(raw.get("synthetic", ())),
        real_folder=str(raw.get("real_folder", "")),
        router=str(raw.get("router", "")),
        predictor=str(raw.get("predictor", "")),
        loops={str(k): int(v) for k, v in raw.get("loops", {}).items()},
    )


def _current(dirs: ArtifactDirs, pool: PoolSpec, root: Path, plan: Plan) -> bool:
    """Whether the current versions can stay: they know the pool, and are the operator's or a bootstrap of
    exactly ``plan``."""
    if not (_covers(dirs.router, pool) and _covers(dirs.predictor, pool)):
        return False
    made = read_provenance(root)
    versions = (artifacts.current_version(dirs.router), artifacts.current_version(dirs.predictor))
    if made is None:
        # A bootstrap from before provenance was recorded left its generated traces; it was all synthetic.
        legacy = (root.parent / "traces" / "bootstrap" / "traces.jsonl").exists()
        if legacy and plan[0]:
            log.warning("%s: an all-synthetic bootstrap; retraining on the real traces now available", root)
            return False
        return True
    if versions != (made.router, made.predictor):
        return True  # trained since by the operator or the retrain job: theirs to keep
    if made.plan() != plan:
        log.warning(
            "%s: the bootstrap was trained on %s; retraining on the real traces and loops there are now (%s)",
            root,
            made.describe(),
            Provenance(plan[0], plan[1], loops=plan[2]).describe() or "none",
        )
        return False
    return True


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
