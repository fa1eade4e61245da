"""Generate trace and outcome rows from the outcome model, in exactly the shape live workers record.

NOTE(generate): each generated program is one (problem, workflow) run on every requested engine, so a router
sees every model's label for the same prompt, as it would from the paper's offline traces. Rows match
``services.worker`` field for field:

- texts: ``system_text``, ``user_text`` and ``prompt_text`` come from ``workflows.stage_messages``, as the
  demo client sends them. The history of earlier stages is a filler whose token proxy equals those stages'
  generated output tokens, after a marker that says so (the instrument makes lengths, not texts), so the
  prompt-length features a predictor computes see the same growth along the workflow as on live traces;
- ``prompt_tokens``: ``workflows.approx_prompt_tokens`` (the project's token proxy plus chat framing), where
  a live worker records the engine's count; ``completion_tokens`` and ``finish_reason``: the outcome model;
- ``predicted``, ``predicted_p90``, queue and run timings and ``enqueued_unix`` are 0: nothing was scheduled;
- ``extra`` says where the row came from (``"source": "outcome-model"``) and carries the ceiling of the run
  (``p_success``, ``median_remaining``) for evaluating learners; live rows leave ``extra`` empty.

Files (the layout of ``services.jobs.export``): ``traces-<engine>.jsonl`` and ``outcomes.jsonl``.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import random
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.common.tokens import approx_tokens
from services.common.tracestore import write_jsonl
from services.common.types import OutcomeRow, TraceRow
from services.workload.corpus import Problem, embedded_corpus, load_corpus
from services.workload.models import resolve_model
from services.workload.outcome import Outcome, OutcomeModel
from services.workload.workflows import WORKFLOWS, Workflow, approx_prompt_tokens, stage_messages

log = logging.getLogger(__name__)

SOURCE_TAG = "outcome-model"


@dataclass(frozen=True, slots=True)
class Binding:
    """One engine to generate traces for: the names its rows carry, and the paper model that drives them."""

    engine: str
    model: str  # the model name the engine reports (what rows and the router call it)
    stand_in: str  # the paper model whose outcome model produces its lengths and labels


@dataclass(frozen=True, slots=True)
class Program:
    """One generated workflow run on one engine."""

    traces: tuple[TraceRow, ...]
    outcome: OutcomeRow
    detail: Outcome


@dataclass(frozen=True, slots=True)
class Written:
    trace_files: tuple[Path, ...]
    outcome_file: Path
    programs: int
    traces: int


def bindings_for(models: Sequence[str]) -> tuple[Binding, ...]:
    """One engine per paper model, named by its key and reporting its Hugging Face id."""
    specs = [resolve_model(m) for m in models]
    return tuple(Binding(engine=s.key, model=s.name, stand_in=s.key) for s in specs)


def history_filler(stage: int, role: str, tokens: int) -> str:
    """Stand-in text for a stage output of ``tokens`` tokens: a marker, then one-token words to the count."""
    marker = f"[generated stand-in for the {role} output of stage {stage + 1}: {tokens} tokens]"
    return marker + " x" * max(0, tokens - approx_tokens(marker))


def _uid(*parts: object) -> str:
    return str(uuid.UUID(bytes=hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=16).digest()))


def _program(
    problem: Problem, wf: Workflow, binding: Binding, detail: Outcome, program_id: str
) -> tuple[tuple[TraceRow, ...], OutcomeRow]:
    rows = []
    history: list[str] = []
    for stage in range(wf.n_stages):
        msgs = stage_messages(wf, stage, problem.text, history)
        rows.append(
            TraceRow(
                request_id=_uid(program_id, stage),
                program_id=program_id,
                workflow=wf.name,
                stage=stage,
                engine=binding.engine,
                model=binding.model,
                system_text="\n".join(m.content for m in msgs if m.role == "system"),
                user_text=next(m.content for m in msgs if m.role == "user"),
                prompt_text="\n".join(m.content for m in msgs),
                prompt_tokens=approx_prompt_tokens(msgs),
                completion_tokens=detail.stage_tokens[stage],
                predicted=0,
                predicted_p90=0,
                queue_wait_s=0.0,
                run_s=0.0,
                finish_reason=detail.finish_reasons[stage],
                extra={
                    "source": SOURCE_TAG,
                    "problem_id": problem.id,
                    "stand_in": detail.model,
                    "p_success": round(detail.p_success, 6),
                    "median_remaining": detail.median_remaining[stage],
                    "p90_remaining": detail.p90_remaining[stage],
                },
            )
        )
        history.append(history_filler(stage, wf.roles[stage].name, detail.stage_tokens[stage]))
    outcome = OutcomeRow(
        program_id=program_id,
        workflow=wf.name,
        model=binding.model,
        engine=binding.engine,
        outcome=detail.score,
    )
    return tuple(rows), outcome


def generate(
    problems: Sequence[Problem],
    outcome_model: OutcomeModel,
    bindings: Sequence[Binding],
    n: int,
    seed: int,
    workflows: Sequence[Workflow] = WORKFLOWS,
) -> Iterator[Program]:
    """``n`` (problem, workflow) draws, each run on every binding. Deterministic for the arguments.

    A problem is drawn uniformly, then a workflow uniformly among ``workflows`` of its domain (problems whose
    domain has none are never drawn).
    """
    by_domain = {d: [w for w in workflows if w.domain == d] for d in ("code", "math")}
    pool = [p for p in problems if by_domain.get(p.domain)]
    if not pool or not bindings:
        raise ValueError("nothing to generate: no problem fits the workflows, or no engine was given")
    rng = random.Random(seed)
    for i in range(n):
        problem = pool[rng.randrange(len(pool))]
        wf = by_domain[problem.domain][rng.randrange(len(by_domain[problem.domain]))]
        for b in bindings:
            detail = outcome_model.sample(problem, wf, b.stand_in, seed=seed * 1_000_003 + i)
            traces, outcome = _program(problem, wf, b, detail, _uid("program", seed, i, b.engine))
            yield Program(traces=traces, outcome=outcome, detail=detail)


def write_traces(out_dir: Path, programs: Iterator[Program]) -> Written:
    """Write ``traces-<engine>.jsonl`` per engine and ``outcomes.jsonl`` under ``out_dir``."""
    per_engine: dict[str, list[TraceRow]] = {}
    outcomes: list[OutcomeRow] = []
    for prog in programs:
        outcomes.append(prog.outcome)
        per_engine.setdefault(prog.outcome.engine, []).extend(prog.traces)
    files = []
    for engine, rows in sorted(per_engine.items()):
        path = out_dir / f"traces-{engine}.jsonl"
        write_jsonl(path, rows)
        files.append(path)
    outcome_file = out_dir / "outcomes.jsonl"
    write_jsonl(outcome_file, outcomes)
    return Written(tuple(files), outcome_file, len(outcomes), sum(len(r) for r in per_engine.values()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write generated traces (outcome model) as JSONL.")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument(
        "--n", type=int, default=1000, help="(problem, workflow) draws; each runs on every model"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", nargs="+", default=["qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-14b"])
    parser.add_argument("--embedded", action="store_true", help="use the embedded corpus, not the real one")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    corpus = embedded_corpus() if args.embedded else load_corpus()
    model = OutcomeModel(corpus.problems, models=args.models)
    written = write_traces(
        args.out, generate(corpus.problems, model, bindings_for(args.models), args.n, args.seed)
    )
    log.info(
        "corpus %s (%d problems): %d programs, %d trace rows in %s",
        corpus.origin,
        len(corpus.problems),
        written.programs,
        written.traces,
        args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
