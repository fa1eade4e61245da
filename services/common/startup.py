"""What a starting worker is doing: its start-up phase, written to Redis as it goes, read by the launcher and
the health checks.

NOTE(startup): a real engine's first start fetches and converts its weights, loads the engine and measures
a first profile, minutes on a small CPU. A fixed start timeout cannot tell that from a hang, so the worker
reports each step (``Keys.engine_startup``) and a waiting launcher judges it by its *progress*: it fails a
start whose record has not moved for a stall limit, never one that keeps moving. Each report is a phase with
an optional count (bytes of parts fetched, profile points measured), so a long phase still moves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from services.common.keys import Keys, StartupField

log = logging.getLogger(__name__)


class Phase:
    """Values of ``StartupField.PHASE``, in the order a first start passes through them."""

    STARTING: Final = "starting"  # the engine's libraries imported (vLLM and torch: seconds on a busy CPU)
    FETCHING: Final = "fetching"  # model weights from the package registry
    ASSEMBLING: Final = "assembling"  # part files joined and checked
    CONVERTING: Final = "converting"  # GGUF to the safetensors vLLM loads
    LOADING: Final = "loading"  # the engine itself
    PROFILING: Final = "profiling"  # the first, quick profile
    READY: Final = "ready"  # registered: the heartbeat speaks from here on


# Records older than this are gone: a start that never finished leaves nothing for long.
STARTUP_TTL_S: Final = 3600


@dataclass(frozen=True, slots=True)
class StartupState:
    """One report of a starting worker: its phase, what it is at, and how far (``done`` of ``total``)."""

    phase: str
    detail: str = ""
    done: float = 0.0
    total: float = 0.0
    unit: str = ""  # "MB", "points": what done and total count
    started_ms: int = 0  # when this start began (the worker's clock)
    updated_ms: int = 0  # when this report was written
    worker_id: str = ""

    def written_since(self, started_unix: float) -> bool:
        """Whether this report belongs to a start that began at ``started_unix`` (wall clock): a record an
        earlier start left says nothing about this one. A second of slack covers clock reads racing."""
        return self.updated_ms / 1000.0 >= started_unix - 1.0

    def describe(self) -> str:
        """``converting SmolLM2 (12 s)``-style text for a console line or a health answer."""
        text = self.phase + (f" {self.detail}" if self.detail else "")
        if self.total:
            text += f": {self.done:,.0f}/{self.total:,.0f} {self.unit}".rstrip()
        return text

    def to_mapping(self) -> dict[str, str]:
        f = StartupField
        return {
            f.PHASE: self.phase,
            f.DETAIL: self.detail,
            f.DONE: repr(self.done),
            f.TOTAL: repr(self.total),
            f.UNIT: self.unit,
            f.STARTED_MS: str(self.started_ms),
            f.UPDATED_MS: str(self.updated_ms),
            f.WORKER_ID: self.worker_id,
        }

    @staticmethod
    def from_mapping(raw: Mapping[Any, Any]) -> StartupState | None:
        """The state a ``HGETALL`` returned (bytes or str), or None for an empty or unreadable record."""
        d = {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in raw.items()
        }
        f = StartupField
        if not d.get(f.PHASE):
            return None
        try:
            return StartupState(
                phase=d[f.PHASE],
                detail=d.get(f.DETAIL, ""),
                done=float(d.get(f.DONE) or 0),
                total=float(d.get(f.TOTAL) or 0),
                unit=d.get(f.UNIT, ""),
                started_ms=int(d.get(f.STARTED_MS) or 0),
                updated_ms=int(d.get(f.UPDATED_MS) or 0),
                worker_id=d.get(f.WORKER_ID, ""),
            )
        except ValueError:
            return None


def stalled_for(last_progress_s: float, now_s: float, stall_s: float) -> float | None:
    """Seconds without progress when past ``stall_s`` (the start has failed), else None: the launcher's rule,
    a pure function of when the start last moved."""
    idle = now_s - last_progress_s
    return idle if idle > stall_s else None


class StartupSink(Protocol):
    """Where the steps of a start are reported (the worker's ``StartupReporter``; tests record them)."""

    def report(
        self, phase: str, detail: str = "", done: float = 0.0, total: float = 0.0, unit: str = ""
    ) -> None: ...


class NoStartupReport:
    """A sink that drops every report: code that fetches or converts outside a worker's start (CLI, tests)."""

    def report(
        self, phase: str, detail: str = "", done: float = 0.0, total: float = 0.0, unit: str = ""
    ) -> None:
        return None


class StartupReporter:
    """Writes each step of one worker's start to ``Keys.engine_startup`` with a blocking client.

    Blocking on purpose: the steps it reports (pip, the conversion, vLLM's engine start) block the process
    anyway. A Redis that cannot be reached costs a log line, never the start itself.
    """

    def __init__(self, client: Any, keys: Keys, engine_id: str, worker_id: str) -> None:
        self._r = client
        self._key = keys.engine_startup(engine_id)
        self._worker_id = worker_id
        self._started_ms = int(time.time() * 1000)
        self._fresh = True

    def report(
        self, phase: str, detail: str = "", done: float = 0.0, total: float = 0.0, unit: str = ""
    ) -> None:
        state = StartupState(
            phase, detail, done, total, unit, self._started_ms, int(time.time() * 1000), self._worker_id
        )
        log.info("start-up: %s", state.describe())
        try:
            with self._r.pipeline(transaction=False) as pipe:
                if self._fresh:  # an earlier start's fields must not linger beside this one's
                    pipe.delete(self._key)
                pipe.hset(self._key, mapping=state.to_mapping())
                pipe.expire(self._key, STARTUP_TTL_S)
                pipe.execute()
            self._fresh = False
        except Exception as exc:  # noqa: BLE001 - reporting must never fail a start
            log.warning("could not report the start-up phase to Redis: %s", exc)


def read_startup(client: Any, keys: Keys, engine_id: str) -> StartupState | None:
    """The engine's last start-up report, or None (a blocking client, decoded or not)."""
    return StartupState.from_mapping(client.hgetall(keys.engine_startup(engine_id)))
