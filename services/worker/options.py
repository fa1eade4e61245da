"""What a worker is told (``WorkerOptions``, from its settings) and what it holds (``Job``: one claim)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from services.common.types import ClaimedRequest


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    engine_id: str
    kind: str
    worker_id: str
    prefetch: int = 2
    lease_s: float = 10.0
    grace_s: float = 30.0
    heartbeat_s: float = 1.0
    claim_wait_s: float = 0.5
    # Deltas are coalesced across every running request (publisher.py): one flush every publish_interval_s,
    # sooner once publish_chars wait; a request's first text goes out at once.
    publish_interval_s: float = 0.05
    publish_chars: int = 65536
    # A request running longer than this is aborted (a runaway generation must not hold a slot forever).
    max_run_s: float = 3600.0
    # Tests: drain the queue and return (burst), or stop claiming after this many claims.
    burst: bool = False
    max_requests: int | None = None
    # An engine with neither a stored measured profile nor one of its own (a real engine on first start)
    # gets a quick profile before it takes work, so the load balancer can weigh it; the result is stored.
    profile_on_start: bool = True
    # That first profile is a quick one; the whole curve is measured once the engine has been idle this
    # long (services.worker.refine), and replaces it. 0: never.
    refine_idle_s: float = 5.0
    # Distinct worker deaths a request may be running in before it is failed as poison (queue_scripts);
    # registered with the engine so that every reaper of it applies this worker's limit.
    max_attempts: int = 3


@dataclass(eq=False)
class Job:
    """One claim the worker holds, from its claim to its end."""

    claimed: ClaimedRequest
    key: str  # the engine's request key, unique per attempt
    started: bool = False
    lost: bool = False  # the lease is gone (re-run elsewhere): drop silently
    cancel: bool = False  # the client cancelled: abort and complete as cancelled
    aborted: bool = False
    # Its final event is being written: a renewal that finds it no longer running raced the completion,
    # not a lost lease (it used to log "lease lost" and abort a request that had just finished).
    finishing: bool = False
    published: int = 0  # characters of its text the publisher has sent
    task: asyncio.Task[None] | None = None

    @property
    def request_id(self) -> str:
        return self.claimed.request.request_id

    @property
    def attempt(self) -> int:
        return self.claimed.attempt

    @property
    def stale(self) -> bool:
        return self.lost
