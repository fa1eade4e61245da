"""The committed dataset: the product's trace export, kept to finished runs, stripped to what may be shared.

``publish`` folds the raw export (``services.jobs.export`` layout: ``traces-<engine>.jsonl``,
``outcomes.jsonl``, full texts, under the collection's state folder) and the collector's own per-run
records (``runs.jsonl``) into the dataset folder, in the same layout, so ``chimera train router|predictor
--traces <dataset>`` reads it as it is. It keeps only programs with a verified outcome (a run cut short
has no label, and its partial stages would teach the predictor a workflow that ends early), each trace row
once, and for sources outside ``PUBLISHABLE_TEXT`` blanks the task and prompt texts (the role prompts are
ours and stay), recording their lengths instead. Idempotent, and every file is replaced atomically, so the
collection can be killed at any point.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from services.collect.plan import PUBLISHABLE_TEXT, parse_program_id
from services.common.tracestore import read_trace_folder, write_jsonl
from services.common.types import OutcomeRow, TraceRow
from services.jobs.export import outcome_file, trace_file

RUNS = "runs.jsonl"
SUMMARY = "summary.json"


@dataclass(frozen=True, slots=True)
class RunRecord:
    """The collector's own line per finished workflow: what the trace rows do not carry."""

    program_id: str
    engine: str
    model: str
    workflow: str
    problem_id: str
    stages: int
    prompt_tokens: int
    completion_tokens: int
    e2e_s: float  # first stage sent to last stage answered (verification excluded)
    check: str  # the verifier that scored it: humaneval | leetcode | numeric
    score: float
    detail: str  # the verifier's few words; blank for sources whose answers are not ours to publish
    started_unix: float
    max_tokens: int
    concurrency: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


def read_runs(folder: Path) -> list[RunRecord]:
    path = folder / RUNS
    if not path.exists():
        return []
    return [RunRecord(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def append_run(folder: Path, record: RunRecord) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / RUNS).open("a", encoding="utf-8") as f:
        f.write(record.to_json() + "\n")


def redact(row: TraceRow) -> TraceRow:
    """The row as it may be committed: problem id and source in ``extra``; texts blank unless publishable."""
    run = parse_program_id(row.program_id)
    if run is None or row.extra.get("problem_id"):
        return row  # not a collection row, or already done (publishing twice must not zero the lengths)
    extra: dict[str, Any] = {**row.extra, "problem_id": run.problem_id, "source": run.source}
    if run.source in PUBLISHABLE_TEXT:
        return replace(row, extra=extra)
    extra |= {"redacted": True, "user_chars": len(row.user_text), "prompt_chars": len(row.prompt_text)}
    return replace(row, user_text="", prompt_text="", extra=extra)


def _redact_run(record: RunRecord) -> RunRecord:
    run = parse_program_id(record.program_id)
    if run is None or run.source in PUBLISHABLE_TEXT:
        return record
    return replace(record, detail="")  # e.g. "answer 12, expected 391" would publish the answer


def _write_lines(path: Path, lines: Iterable[str]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    tmp.replace(path)


def publish(raw: Path, out: Path) -> dict[str, int]:
    """Merge ``raw`` into the dataset ``out``; returns its row counts."""
    old_traces, old_outcomes = read_trace_folder(out)
    new_traces, new_outcomes = read_trace_folder(raw)
    outcomes: dict[str, OutcomeRow] = {}
    for o in [*old_outcomes, *new_outcomes]:
        if parse_program_id(o.program_id) is not None:
            outcomes.setdefault(o.program_id, o)
    traces: dict[tuple[str, int, int], TraceRow] = {}
    for t in [*old_traces, *new_traces]:
        if t.program_id in outcomes:
            traces.setdefault((t.program_id, t.stage, t.attempt), redact(t))
    runs: dict[str, RunRecord] = {}
    for r in [*read_runs(out), *read_runs(raw)]:
        if r.program_id in outcomes:
            runs.setdefault(r.program_id, _redact_run(r))
    by_engine: dict[str, list[TraceRow]] = defaultdict(list)
    for t in sorted(traces.values(), key=lambda t: (t.enqueued_unix, t.program_id, t.stage, t.attempt)):
        by_engine[t.engine].append(t)
    out.mkdir(parents=True, exist_ok=True)
    for engine, rows in by_engine.items():
        write_jsonl(trace_file(out, engine), rows)
    write_jsonl(outcome_file(out), outcomes.values())
    _write_lines(out / RUNS, (r.to_json() for r in sorted(runs.values(), key=lambda r: r.started_unix)))
    _write_lines(out / SUMMARY, [json.dumps(summarize(list(runs.values())), indent=2, sort_keys=True)])
    return {"programs": len(outcomes), "traces": len(traces), "runs": len(runs)}


def summarize(runs: Sequence[RunRecord]) -> dict[str, Any]:
    """Per engine: workflows, pass rate, tokens and seconds per workflow, per source and per workflow type."""
    out: dict[str, Any] = {}
    for engine in sorted({r.engine for r in runs}):
        mine = [r for r in runs if r.engine == engine]
        out[engine] = {
            "model": mine[0].model,
            **_stats(mine),
            "by_source": {
                s: _stats([r for r in mine if r.problem_id.startswith(f"{s}/")]) for s in _sources(mine)
            },
            "by_workflow": {
                w: _stats([r for r in mine if r.workflow == w]) for w in sorted({r.workflow for r in mine})
            },
        }
    return out


def _sources(runs: Sequence[RunRecord]) -> list[str]:
    return sorted({r.problem_id.split("/", 1)[0] for r in runs})


def _stats(runs: Sequence[RunRecord]) -> dict[str, Any]:
    return {
        "workflows": len(runs),
        "passed": sum(r.score >= 1.0 for r in runs),
        "pass_rate": round(statistics.fmean(r.score for r in runs), 3),
        "completion_tokens": sum(r.completion_tokens for r in runs),
        "completion_tokens_per_workflow": round(statistics.fmean(r.completion_tokens for r in runs), 1),
        "median_e2e_s": round(statistics.median(r.e2e_s for r in runs), 1),
        "mean_e2e_s": round(statistics.fmean(r.e2e_s for r in runs), 1),
        "concurrency": sorted({r.concurrency for r in runs}),
        "max_tokens": sorted({r.max_tokens for r in runs}),
    }
