"""Read and write trace rows (one per completed stage) and outcome rows (one per finished workflow).

Sources: JSONL files (one ``to_json`` object per line) and the Redis streams the queue scripts and EndProgram
append to (``Keys.traces(engine)`` for every engine in ``Keys.engines()``, and ``Keys.outcomes()``).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

from redis.asyncio import Redis

from services.common.keys import Keys
from services.common.types import OutcomeRow, TraceRow

_PAGE = 1000
Row = TypeVar("Row", TraceRow, OutcomeRow)


def read_traces_jsonl(path: Path) -> list[TraceRow]:
    return [TraceRow.from_json(line) for line in _lines(path)]


def read_outcomes_jsonl(path: Path) -> list[OutcomeRow]:
    return [OutcomeRow.from_json(line) for line in _lines(path)]


OUTCOMES_FILE = "outcomes.jsonl"


def read_trace_folder(folder: Path) -> tuple[list[TraceRow], list[OutcomeRow]]:
    """The rows of a folder of ``traces*.jsonl`` and ``outcomes.jsonl``: a trace export, the collector's
    dataset, or the bootstrap's generated traces (what ``chimera train --traces`` reads)."""
    traces = [r for p in sorted(folder.glob("traces*.jsonl")) for r in read_traces_jsonl(p)]
    outcomes = folder / OUTCOMES_FILE
    return traces, read_outcomes_jsonl(outcomes) if outcomes.exists() else []


def write_jsonl(path: Path, rows: Iterable[TraceRow | OutcomeRow]) -> int:
    """Write rows, one JSON object a line, atomically (temp file + rename). Returns the row count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    n = 0
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(row.to_json())
            f.write("\n")
            n += 1
    tmp.replace(path)
    return n


def _lines(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield line


async def read_traces_redis(redis: Redis, keys: Keys) -> list[TraceRow]:
    """Every trace row of every registered engine, each engine's stream in append order."""
    engines: list[str] = sorted(cast(set[str], await redis.smembers(keys.engines())))
    rows: list[TraceRow] = []
    for engine in engines:
        async for fields in _stream(redis, keys.traces(engine)):
            rows.append(TraceRow.from_json(fields["row"]))
    return rows


async def read_outcomes_redis(redis: Redis, keys: Keys) -> list[OutcomeRow]:
    """Every outcome row. Accepts entries holding one JSON ``row`` field or the row's fields flat."""
    rows: list[OutcomeRow] = []
    async for fields in _stream(redis, keys.outcomes()):
        if "row" in fields:
            rows.append(OutcomeRow.from_json(fields["row"]))
        else:
            rows.append(
                OutcomeRow(
                    program_id=fields["program_id"],
                    workflow=fields.get("workflow", ""),
                    model=fields["model"],
                    engine=fields.get("engine", ""),
                    outcome=float(fields["outcome"]),
                )
            )
    return rows


async def _stream(redis: Redis, key: str) -> AsyncIterator[dict[str, str]]:
    """Yield each entry's fields of a stream (the client decodes them), paging with exclusive ranges."""
    start = "-"
    while True:
        page: list[Any] = await redis.xrange(key, min=start, max="+", count=_PAGE) or []
        for _, fields in page:
            yield dict(fields or {})
        if len(page) < _PAGE:
            return
        start = "(" + page[-1][0]


def remaining_tokens(rows: Sequence[TraceRow]) -> list[int]:
    """The predictor's training target, aligned with ``rows`` (paper §2.2).

    For each stage row: the ``completion_tokens`` of that stage plus every later stage of the same
    ``program_id``. A stage recorded more than once (a retried attempt) counts once, with its highest
    attempt's tokens, so retries never inflate a target.
    """
    per_stage: dict[tuple[str, int], TraceRow] = {}
    for r in rows:
        key = (r.program_id, r.stage)
        prev = per_stage.get(key)
        if prev is None or r.attempt >= prev.attempt:
            per_stage[key] = r
    by_program: dict[str, list[tuple[int, int]]] = {}
    for (pid, stage), r in per_stage.items():
        by_program.setdefault(pid, []).append((stage, r.completion_tokens))
    # Suffix sums per program: remaining[pid][stage] = tokens of this and every later recorded stage.
    suffix: dict[tuple[str, int], int] = {}
    for pid, stages in by_program.items():
        total = 0
        for stage, tokens in sorted(stages, reverse=True):
            total += tokens
            suffix[(pid, stage)] = total
    return [suffix[(r.program_id, r.stage)] for r in rows]


def held_out(task_text: str, fraction: float) -> bool:
    """Deterministic train/test split by task text, shared by router and predictor training.

    Every program, workflow type and model that ran the same task lands on the same side, so held-out
    metrics never reward remembering a task seen in training under another workflow or model.
    """
    digest = hashlib.sha256(task_text.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction
