"""What the fault benchmark counts, from what its clients saw: pure functions over recorded streams.

A workflow ends in exactly one of: completed, failed with a retryable code, failed with another code, or
lost. Duplicated text is counted on top of that (a completed workflow can carry it):

- **lost**: the client got no usable answer and no error that says so: a stage hung past the client's
  timeout, a stream ended without its final event, a final marked ``cancelled`` the client never asked
  for, an empty answer, or a workflow that ended with fewer answered stages than it has.
- **duplicated**: a stage whose streamed deltas, read as the API documents (text of a lower attempt is
  discarded once a higher attempt appears), do not add up to the final text; or a stage answered twice per
  the engines' trace streams.
- **restarted**: informational: a stage whose deltas carry two attempt numbers. A client that honours the
  attempt numbers shows the right text; one that simply concatenates deltas shows text of both attempts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Codes that tell a client plainly to come back later (gRPC's own guidance for retries).
RETRYABLE = frozenset({"UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "ABORTED"})
# Client-side markers for answers that never came (not gRPC codes).
HUNG = "HUNG"
NO_FINAL = "NO_FINAL"
LOST_MARKERS = frozenset({HUNG, NO_FINAL})


@dataclass(frozen=True, slots=True)
class StageRecord:
    stage: int
    request_ids: tuple[str, ...]  # one per try the client made (overload retries get a fresh id)
    deltas: tuple[tuple[int, str], ...] = ()  # (attempt, text), in arrival order
    final_text: str | None = None  # None: no final event
    finish_reason: str = ""
    attempts: int = 0  # the final's attempt count
    engine: str = ""
    error_code: str | None = None  # a gRPC status name, HUNG or NO_FINAL
    error: str = ""
    # A hung stage's request as Redis held it when the client gave up (faults_stack.request_state).
    redis_state: Mapping[str, Any] = field(default_factory=dict)
    # From the first try to the outcome, and when (unix s) it came: whether the SDK's retry budget was
    # spent, and which fault of the run's record and which log lines it meets.
    seconds: float = 0.0
    ended_unix: float = 0.0
    # Read whole (the SDK's final_only): no deltas, so duplicated text can only show as a second trace row.
    streamed: bool = True


@dataclass(frozen=True, slots=True)
class WorkflowRecord:
    program_id: str
    workflow: str
    n_stages: int
    stages: tuple[StageRecord, ...]
    started_s: float = 0.0  # monotonic
    ended_s: float = 0.0
    end_error: str = ""  # EndProgram failed: its program entry stays until its TTL


def contract_text(deltas: Iterable[tuple[int, str]]) -> str:
    """The text a client following the API shows: a higher attempt starts over; a lower one is stale."""
    current, parts = 0, list[str]()
    for attempt, text in deltas:
        if attempt > current:
            current, parts = attempt, []
        if attempt == current:
            parts.append(text)
    return "".join(parts)


def naive_text(deltas: Iterable[tuple[int, str]]) -> str:
    return "".join(text for _attempt, text in deltas)


def stage_duplicated(s: StageRecord) -> bool:
    return s.streamed and s.final_text is not None and contract_text(s.deltas) != s.final_text


def stage_restarted(s: StageRecord) -> bool:
    return len({a for a, _ in s.deltas}) > 1


def stage_lost_reason(s: StageRecord) -> str | None:
    if s.error_code in LOST_MARKERS:
        return s.error_code.lower()
    if s.error_code is not None:
        return None  # an error the client was told
    if s.final_text is None:
        return "no_final"
    if s.finish_reason == "cancelled":
        return "cancelled"
    if s.final_text == "":
        return "empty_answer"
    return None


def outcome(w: WorkflowRecord) -> tuple[str, str]:
    """(category, detail): completed | failed_retryable | failed_other | lost, with the code or reason."""
    for s in w.stages:
        reason = stage_lost_reason(s)
        if reason is not None:
            return "lost", reason
        if s.error_code is not None:
            kind = "failed_retryable" if s.error_code in RETRYABLE else "failed_other"
            return kind, s.error_code
    if len(w.stages) < w.n_stages:
        return "lost", "missing_stage"
    return "completed", ""


@dataclass(frozen=True, slots=True)
class Counts:
    started: int = 0
    completed: int = 0
    failed_retryable: int = 0
    failed_other: int = 0
    lost: int = 0
    duplicated_workflows: int = 0
    duplicated_stages: int = 0  # streamed text != final (attempts honoured)
    traced_twice: int = 0  # stages with more than one trace row
    restarted_stages: int = 0  # deltas of two attempts (a naive client would duplicate text)
    stages_answered: int = 0
    whole_stages_answered: int = 0  # of stages_answered, read whole (no deltas)
    end_program_failed: int = 0
    codes: Mapping[str, int] = field(default_factory=dict)  # failure code or lost reason -> workflows
    examples: tuple[Mapping[str, Any], ...] = ()  # a few mismatching stages, as evidence
    failures: tuple[Mapping[str, Any], ...] = ()  # a few failed stages with the error the client saw

    def as_dict(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "completed": self.completed,
            "failed_retryable": self.failed_retryable,
            "failed_other": self.failed_other,
            "lost": self.lost,
            "duplicated_workflows": self.duplicated_workflows,
            "duplicated_stages": self.duplicated_stages,
            "traced_twice": self.traced_twice,
            "restarted_stages": self.restarted_stages,
            "stages_answered": self.stages_answered,
            "whole_stages_answered": self.whole_stages_answered,
            "end_program_failed": self.end_program_failed,
            "codes": dict(self.codes),
            "examples": list(self.examples),
            "failures": list(self.failures),
        }


def _example(w: WorkflowRecord, s: StageRecord) -> dict[str, Any]:
    streamed = contract_text(s.deltas)
    final = s.final_text or ""
    return {
        "program_id": w.program_id,
        "stage": s.stage,
        "request_ids": list(s.request_ids),
        "attempts_seen": sorted({a for a, _ in s.deltas}),
        "final_attempts": s.attempts,
        "streamed_chars": len(streamed),
        "final_chars": len(final),
        "streamed_head": streamed[:120],
        "final_head": final[:120],
    }


def count(
    workflows: Sequence[WorkflowRecord], traced: Mapping[str, int] | None = None, max_examples: int = 3
) -> Counts:
    """Tally the workflows. ``traced``: trace rows per request id (None when the traces are gone, e.g.
    with the Redis data after a restart without persistence)."""
    by: Counter[str] = Counter()
    codes: Counter[str] = Counter()
    dup_wf = dup_st = twice = restarted = answered = whole = 0
    examples: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    for w in workflows:
        kind, detail = outcome(w)
        by[kind] += 1
        if detail:
            codes[f"{kind}:{detail}"] += 1
        failures.extend(
            {
                "program_id": w.program_id,
                "stage": s.stage,
                "code": s.error_code,
                "error": s.error,
                "deltas": len(s.deltas),
                "seconds": s.seconds,
                "ended_unix": s.ended_unix,
                **({"redis_state": dict(s.redis_state)} if s.redis_state else {}),
            }
            for s in w.stages
            if s.error_code is not None and len(failures) < max_examples
        )
        dup_here = False
        for s in w.stages:
            answered += s.final_text is not None
            whole += s.final_text is not None and not s.streamed
            restarted += stage_restarted(s)
            twice_here = traced is not None and any(traced.get(r, 0) > 1 for r in s.request_ids)
            twice += twice_here
            if stage_duplicated(s):
                dup_st += 1
                if len(examples) < max_examples:
                    examples.append(_example(w, s))
            dup_here = dup_here or stage_duplicated(s) or twice_here
        dup_wf += dup_here
    return Counts(
        started=len(workflows),
        completed=by["completed"],
        failed_retryable=by["failed_retryable"],
        failed_other=by["failed_other"],
        lost=by["lost"],
        duplicated_workflows=dup_wf,
        duplicated_stages=dup_st,
        traced_twice=twice,
        restarted_stages=restarted,
        stages_answered=answered,
        whole_stages_answered=whole,
        end_program_failed=sum(1 for w in workflows if w.end_error),
        codes=dict(sorted(codes.items())),
        examples=tuple(examples),
        failures=tuple(failures),
    )
