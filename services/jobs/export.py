"""Trace export: copy every engine's trace stream and the outcome stream into JSONL files, exactly once.

NOTE(export): the streams are capped (``Retention.traces_maxlen``), so rows must be copied out before they
are trimmed; training then reads files instead of scanning Redis. Layout under ``traces_dir``:
``traces-<engine>.jsonl`` (one ``TraceRow.to_json()`` per line) and ``outcomes.jsonl`` (``OutcomeRow``).

Exactly once, even when the task runs twice at once, is retried after a crash, or is killed mid-batch:

* A lease (``Keys.export_lock``: a random token, ``SET NX PX``) lets one export run at a time; a second
  run returns at once with ``busy=True``.
* After each batch is appended and fsynced, one Lua script checks the lease is still ours, records the
  stream's cursor and renews the lease (``Keys.export_cursor``: HASH stream key -> JSON ``{"last_id":
  <last exported stream id>, "bytes": <file size after that batch>, "seen": <entries accounted for>}``).
* Rows the capped stream dropped before they were exported are counted (Redis 7 ``entries-added``) and
  logged as lost, once.
* A run that died between the append and the cursor leaves bytes past the recorded size: the next run
  truncates the file back to the recorded size and reads those rows from the stream again.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis

from services.common.keys import Keys
from services.common.program_scripts import EXPORT_COMMIT, LEASE_RELEASE
from services.common.tracestore import OUTCOMES_FILE
from services.common.types import OutcomeRow, TraceRow

log = logging.getLogger(__name__)


def trace_file(traces_dir: Path, engine: str) -> Path:
    # Engine ids are validated elsewhere, but a file name must never escape the folder whatever they hold.
    return traces_dir / f"traces-{re.sub(r'[^A-Za-z0-9_.-]', '_', engine)}.jsonl"


def outcome_file(traces_dir: Path) -> Path:
    return traces_dir / OUTCOMES_FILE


class Busy(Exception):
    """Another run holds the lease."""


class LeaseLost(Exception):
    """The lease expired mid-export and another run may own the files now: stop writing."""


@dataclass(frozen=True, slots=True)
class StreamExport:
    stream: str
    path: str
    rows: int  # lines appended by this run
    skipped: int  # entries that did not parse as their row type (logged, not written)
    truncated_bytes: int  # bytes of a dead run's unrecorded batch removed before appending


@dataclass(frozen=True, slots=True)
class ExportReport:
    busy: bool = False
    streams: tuple[StreamExport, ...] = field(default_factory=tuple)

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.streams)


def _trace_line(raw: dict[str, str]) -> str:
    return TraceRow.from_json(raw["row"]).to_json()


def _outcome_line(raw: dict[str, str]) -> str:
    # Same two shapes ``services.common.tracestore`` reads: one JSON ``row`` field, or the fields flat.
    if "row" in raw:
        return OutcomeRow.from_json(raw["row"]).to_json()
    row = OutcomeRow(
        program_id=raw["program_id"],
        workflow=raw.get("workflow", ""),
        model=raw["model"],
        engine=raw.get("engine", ""),
        outcome=float(raw["outcome"]),
    )
    return row.to_json()


@contextmanager
def lease(r: redis.Redis, key: str, lease_ms: int) -> Iterator[str]:
    """Hold the lease ``key`` (a random token with PX ``lease_ms``) for the block, or raise ``Busy``."""
    token = secrets.token_hex(16)
    if not r.set(key, token, nx=True, px=lease_ms):
        raise Busy(key)
    try:
        yield token
    finally:
        r.eval(LEASE_RELEASE, 1, key, token)


@dataclass(frozen=True, slots=True)
class Cursor:
    last_id: str = "0-0"  # last stream entry exported (or skipped)
    bytes: int | None = None  # file size right after it; None before the first export
    seen: int = 0  # stream entries accounted for so far: exported, skipped or reported lost

    def to_json(self) -> str:
        return json.dumps({"last_id": self.last_id, "bytes": self.bytes, "seen": self.seen})


def _read_cursor(r: redis.Redis, keys: Keys, stream: str) -> Cursor:
    raw = r.hget(keys.export_cursor(), stream)
    return Cursor(**json.loads(raw)) if raw else Cursor()


def _reconcile(path: Path, recorded: int | None) -> int:
    """Make the file end where the cursor says; returns how many unrecorded bytes were cut."""
    size = path.stat().st_size if path.exists() else 0
    if recorded is None or size == recorded:
        return 0
    if size > recorded:
        with path.open("r+b") as f:
            f.truncate(recorded)
        return size - recorded
    log.warning(
        "%s is shorter than exported (%d < %d bytes): rotated by hand? appending", path, size, recorded
    )
    return 0


def _id_tuple(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def export_stream(
    r: redis.Redis,
    keys: Keys,
    token: str,
    stream: str,
    path: Path,
    to_line: Callable[[dict[str, str]], str],
    batch: int,
    lease_ms: int,
) -> StreamExport:
    """Append entries after the stream's cursor to ``path``, up to the entry that was newest at the start."""
    cur = _read_cursor(r, keys, stream)
    truncated = _reconcile(path, cur.bytes)
    if not r.exists(stream):
        return StreamExport(stream, str(path), 0, 0, truncated)
    info = r.xinfo_stream(stream)
    # One snapshot: the run stops at the entry that was last now (rows arriving meanwhile wait for the next
    # run), and entries-added counts every entry up to it, so rows trimmed before export can be counted.
    end, added = str(info["last-generated-id"]), int(info["entries-added"])
    rows = skipped = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    while _id_tuple(cur.last_id) < _id_tuple(end):
        entries = r.xrange(stream, min=f"({cur.last_id}", max=end, count=batch)
        if not entries:
            break
        lines = []
        for entry_id, fields in entries:
            try:
                lines.append(to_line({str(k): str(v) for k, v in (fields or {}).items()}) + "\n")
            except (KeyError, TypeError, ValueError) as e:
                skipped += 1
                log.warning("skipping entry %s of %s: %r", entry_id, stream, e)
        with path.open("ab") as f:
            f.write("".join(lines).encode())
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        cur = Cursor(str(entries[-1][0]), size, cur.seen + len(entries))
        _commit(r, keys, token, lease_ms, stream, cur)
        rows += len(lines)
    if added > cur.seen:
        log.warning("%s: %d rows were trimmed from the stream before export: lost", stream, added - cur.seen)
        _commit(r, keys, token, lease_ms, stream, Cursor(cur.last_id, cur.bytes, added))
    return StreamExport(stream, str(path), rows, skipped, truncated)


def _commit(r: redis.Redis, keys: Keys, token: str, lease_ms: int, stream: str, cur: Cursor) -> None:
    if not r.eval(
        EXPORT_COMMIT, 2, keys.export_lock(), keys.export_cursor(), token, lease_ms, stream, cur.to_json()
    ):
        raise LeaseLost(stream)


def export_traces(r: redis.Redis, keys: Keys, traces_dir: Path, batch: int, lease_s: float) -> ExportReport:
    """Export every registered engine's trace stream and the outcome stream. ``r`` must decode responses."""
    lease_ms = int(lease_s * 1000)
    engines = sorted(str(e) for e in r.smembers(keys.engines()))
    try:
        with lease(r, keys.export_lock(), lease_ms) as token:
            done = [
                export_stream(
                    r, keys, token, keys.traces(e), trace_file(traces_dir, e), _trace_line, batch, lease_ms
                )
                for e in engines
            ]
            done.append(
                export_stream(
                    r, keys, token, keys.outcomes(), outcome_file(traces_dir), _outcome_line, batch, lease_ms
                )
            )
    except Busy:
        log.info("another trace export is running; skipping")
        return ExportReport(busy=True)
    report = ExportReport(streams=tuple(done))
    log.info("exported %d rows from %d streams into %s", report.rows, len(done), traces_dir)
    return report
