"""The worker of one engine: claims requests from the engine's Redis queue only while the engine has room,
streams their output back, renews their leases, and records a trace row for each finished request.

NOTE(admission): the schedule lives in Redis. The worker holds at most ``max_num_seqs + prefetch`` claims
(running in the engine or about to be), so a better request that arrives while the engine is full waits in
the sorted set, where it can still overtake, rather than in the engine's own waiting list. The small
prefetch keeps a freed slot from idling for a Redis round trip.

NOTE(failure): a claim is a lease. Whatever this process does not finish (a crash, SIGKILL, a shutdown past
its grace period) is left to expire; the reaper of any worker of this engine then re-queues it with its
original score, and the attempt number fences every write of the stale attempt.

NOTE(engine health): the heartbeat carries the engine's health, probed on every tick, so an engine that dies
while idle is seen as soon as one that dies under a request. A dead engine makes the worker unhealthy at
once: it stops claiming, marks the engine dead in its heartbeat (the dispatcher stops routing to it and the
health probe fails), hands its claims back to the queue (RETURN_CLAIMS: only those already handed to the
engine, running or waiting inside it, are charged with the death: any of them may be what killed it, while
a claim the engine never saw cannot have), and exits non-zero so that its supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis
from redis.exceptions import RedisError

from services.common.keys import EngineField
from services.common.queue import QueueStore
from services.common.startup import NoStartupReport, Phase, StartupSink
from services.common.types import ClaimedRequest, EngineProfile
from services.worker import leases, registration
from services.worker.engine.base import (
    Engine,
    EngineDeadError,
)
from services.worker.metrics import WorkerMetrics
from services.worker.options import Job, WorkerOptions
from services.worker.publisher import DeltaPublisher
from services.worker.refine import ProfileRefiner
from services.worker.running import JobRunner

__all__ = ["Worker", "WorkerOptions"]  # WorkerOptions lives in options.py; callers import it from here too

log = logging.getLogger(__name__)


class Worker:
    def __init__(
        self,
        queue: QueueStore,
        redis: Redis,
        engine: Engine,
        opts: WorkerOptions,
        metrics: WorkerMetrics | None = None,
        startup: StartupSink | None = None,
    ) -> None:
        self._q = queue
        # Without one from __main__ (tests), metrics go to a private registry nobody scrapes.
        self._m = metrics or WorkerMetrics(CollectorRegistry(), opts.engine_id, engine.model)
        self._r = redis
        self._engine = engine
        self._o = opts
        self._held: dict[str, Job] = {}
        self._stop = asyncio.Event()
        self._slot_freed = asyncio.Event()
        # Background loops stop on this event rather than by cancellation: a loop on a client built without
        # redis_client (NOTE(cancel) in services.common.redis_conn) could absorb the cancel and run forever.
        self._closing = asyncio.Event()
        self._fatal: EngineDeadError | None = None
        self._reg: registration.Registration | None = None  # re-written by a heartbeat that finds it gone
        # Jobs whose engine died under them: their claims go back to the queue as the worker exits.
        self._orphans: list[Job] = []
        self._marking: asyncio.Task[None] | None = None
        self._deltas = DeltaPublisher(queue, opts.engine_id, opts.publish_interval_s, opts.publish_chars)
        self._jobs = JobRunner(
            queue, engine, self._deltas, self._m, opts, self._abort, self._died_under, self._probe
        )
        self._startup = startup or NoStartupReport()
        self._idle_since = time.monotonic()  # when it last held nothing; what profile refinement waits on
        self.claimed_total = 0

    @property
    def limit(self) -> int:
        """Most claims held at once: the engine's batch plus the prefetch."""
        return self._engine.max_num_seqs + self._o.prefetch

    @property
    def completed_total(self) -> int:
        return self._jobs.completed

    def deltas_published(self) -> int:
        """Stream entries of text written so far, every request together (final events apart)."""
        return self._deltas.entries

    def held(self) -> int:
        return len(self._held)

    def request_stop(self) -> None:
        """Stop claiming; running requests get ``grace_s`` to finish (safe to call from a signal handler)."""
        if not self._stop.is_set():
            log.info("worker %s stopping: no new claims", self._o.worker_id)
            self._stop.set()

    async def run(self) -> None:
        """Serve until stopped, the burst is drained, or ``max_requests`` are done.

        Raises EngineDeadError if the engine died; its claims are then back in the queue.
        """
        o = self._o
        self._startup.report(Phase.LOADING, f"{o.kind} engine {self._engine.model}")
        await self._engine.start()
        try:
            await self._register()
            await leases.reap(self._q, self._m, o.engine_id)
            self._startup.report(Phase.READY, f"serving {self._engine.model}")
            background = [
                asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
                asyncio.create_task(self._renew_loop(), name="renew"),
                asyncio.create_task(self._reap_loop(), name="reap"),
                asyncio.create_task(self._deltas.run(self._closing), name="deltas"),
                *self._refinement(),
            ]
            log.info(
                "serving on engine %s (kind=%s model=%s max_num_seqs=%d prefetch=%d worker=%s)",
                o.engine_id,
                o.kind,
                self._engine.model,
                self._engine.max_num_seqs,
                o.prefetch,
                o.worker_id,
            )
            abandoned: list[Job] = []
            try:
                await self._admission_loop()
                abandoned = await self._drain()
            finally:
                self._closing.set()
                _done, pending = await asyncio.wait(background, timeout=5.0)
                for t in pending:
                    t.cancel()
                if self._fatal is not None:
                    await self._hand_back(self._orphans + abandoned)
        finally:
            await self._engine.stop()
        if self._fatal is not None:
            raise self._fatal
        log.info(
            "worker %s done: %d claimed, %d completed", o.worker_id, self.claimed_total, self.completed_total
        )

    def _refinement(self) -> list[asyncio.Task[object]]:
        """The task that measures the whole profile in idle spells, when the registered one is quick."""
        assert self._reg is not None
        raw = self._reg.fields.get(EngineField.PROFILE)
        if self._o.refine_idle_s <= 0 or not raw or EngineProfile.from_json(raw).complete:
            return []
        refiner = ProfileRefiner(
            self._engine,
            self._r,
            self._q.keys,
            self._o.engine_id,
            self._idle_for,
            lambda: self.claimed_total,
            self._publish_profile,
            self._o.refine_idle_s,
        )
        return [asyncio.create_task(refiner.run(self._closing), name="refine-profile")]

    def _idle_for(self) -> float:
        return 0.0 if self._held else time.monotonic() - self._idle_since

    async def _publish_profile(self, profile: EngineProfile) -> None:
        assert self._reg is not None
        self._reg = registration.with_profile(self._reg, profile)
        await registration.publish_profile(self._r, self._q.keys, self._reg)

    async def _register(self) -> None:
        o = self._o
        self._reg = await registration.announce(
            self._r,
            self._q.keys,
            self._engine,
            o.engine_id,
            o.kind,
            o.worker_id,
            o.profile_on_start,
            o.max_attempts,
            o.lease_s,
            self._startup,
        )

    def _die(self, reason: str) -> None:
        """The engine is dead: stop claiming and say so in the heartbeat now; ``run`` hands the claims back
        and raises. Safe to call more than once (only the first reason is kept)."""
        if self._fatal is not None:
            return
        log.error("engine %s is dead: %s; the worker stops and exits", self._o.engine_id, reason)
        self._m.engine_error("dead")
        self._fatal = EngineDeadError(reason)
        self._stop.set()
        self._slot_freed.set()  # an admission loop waiting for a slot looks at _stop now
        self._marking = asyncio.create_task(self._mark_dead(), name="mark-dead")

    async def _mark_dead(self) -> None:
        assert self._fatal is not None
        try:
            await registration.mark_dead(
                self._r, self._q.keys, self._o.engine_id, self._o.worker_id, str(self._fatal)
            )
        except RedisError as exc:
            log.warning("could not mark the engine dead: %s", exc)

    async def _hand_back(self, jobs: list[Job]) -> None:
        """Mark the engine dead once more (after the heartbeat stopped, so nothing overwrites it) and return
        the claims of ``jobs`` to the queue rather than leave them to expire."""
        if self._marking is not None:
            await self._marking
        await self._mark_dead()
        await leases.hand_back(self._q, self._m, self._o.engine_id, jobs)

    def _room(self) -> int:
        not_started = sum(1 for j in self._held.values() if not j.started)
        in_use = max(len(self._held), self._engine.running() + not_started)
        room = self.limit - in_use
        if self._o.max_requests is not None:
            room = min(room, self._o.max_requests - self.claimed_total)
        return room

    async def _admission_loop(self) -> None:
        o = self._o
        while not self._stop.is_set():
            if o.max_requests is not None and self.claimed_total >= o.max_requests:
                return
            # Cleared before the room is measured, so a slot freed from here on wakes the wait below.
            self._slot_freed.clear()
            room = self._room()
            if room <= 0:
                await self._wait_slot()
                continue
            try:
                claimed = await self._q.claim(o.engine_id, o.worker_id, room, o.lease_s)
            except RedisError as exc:
                log.warning("claim failed (%s); retrying", exc)
                await self._wait_slot()
                continue
            for c in claimed:
                self._start_job(c)
            if claimed:
                self._m.claimed(len(claimed))
                self._occupancy()
            if len(claimed) == room or (claimed and o.burst):
                continue  # perhaps more waits; fewer than asked for means the queue ran dry (CLAIM)
            if o.burst:
                if not self._held:
                    return
                await self._wait_slot()  # the reaper may still re-queue work: look again after each finish
                continue
            with contextlib.suppress(RedisError):
                await self._q.wait_for_work(o.engine_id, o.claim_wait_s)

    async def _wait_slot(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._o.claim_wait_s):
                await self._slot_freed.wait()

    def _start_job(self, c: ClaimedRequest) -> None:
        rid = c.request.request_id
        job = Job(claimed=c, key=f"{rid}:{c.attempt}")
        self._held[rid] = job
        self.claimed_total += 1
        job.task = asyncio.create_task(self._run_job(job), name=f"req-{job.key}")

    async def _drain(self) -> list[Job]:
        """Let held requests finish within the grace period (none when the engine is dead); abandon the rest
        to lease expiry, or to ``run``'s hand-back when the engine is dead. Returns those abandoned."""
        tasks = [j.task for j in self._held.values() if j.task is not None]
        if tasks and self._fatal is None:
            log.info("waiting up to %.1f s for %d running requests", self._o.grace_s, len(tasks))
            await asyncio.wait(tasks, timeout=self._o.grace_s)
        left = list(self._held.values())
        if left:
            log.warning("abandoning %d requests; their leases expire and they are re-queued", len(left))
        for job in left:
            job.lost = True
            if self._fatal is None:
                await self._abort(job)
            if job.task is not None:
                job.task.cancel()
        abandoned = [j.task for j in left if j.task is not None]
        if abandoned:
            await asyncio.wait(abandoned, timeout=5.0)
        return left

    async def _run_job(self, job: Job) -> None:
        try:
            await self._jobs.run(job)
        finally:
            self._held.pop(job.request_id, None)
            if not self._held:
                self._idle_since = time.monotonic()
            self._slot_freed.set()
            self._occupancy()

    def _died_under(self, job: Job, reason: str) -> None:
        """The engine died while running ``job``: its claim goes back as the worker exits (``run``)."""
        self._orphans.append(job)
        self._die(reason)

    def _occupancy(self) -> None:
        self._m.occupancy(self._engine.running(), len(self._held))

    async def _abort(self, job: Job) -> None:
        job.aborted = True
        try:
            await self._engine.abort(job.key)
        except Exception:  # an abort that fails must not take the worker down; the lease still fences
            log.exception("aborting %s failed", job.key)

    async def _renew_loop(self) -> None:
        o = self._o
        while not await self._closed_within(min(o.lease_s / 3.0, 1.0)):
            await leases.renew(self._q, self._m, o.engine_id, self._held, o.lease_s, self._abort)

    async def _probe(self) -> None:
        """Ask the engine whether it is alive; a dead one kills the worker (``_die``)."""
        if self._fatal is not None:
            return
        try:
            # Bounded: a probe that hangs must not stall the heartbeat it rides on.
            reason = await asyncio.wait_for(self._engine.health(), max(2.0, 2 * self._o.heartbeat_s))
        except TimeoutError:
            log.warning("engine health probe timed out; no verdict this time")
            return
        except Exception as exc:
            reason = f"engine health probe raised {exc!r}"
        if reason is not None:
            self._die(reason)

    async def _heartbeat_loop(self) -> None:
        o = self._o
        assert self._reg is not None
        while self._fatal is None:
            await self._probe()
            if self._fatal is not None:
                break  # _die marks the engine dead: never heartbeat it alive again
            try:
                if await registration.heartbeat(
                    self._r, self._q.keys, self._reg, o.worker_id, self._engine.running(), len(self._held)
                ):
                    self._m.reregistered()
            except RedisError as exc:
                log.warning("heartbeat failed: %s", exc)
            self._occupancy()
            if await self._closed_within(o.heartbeat_s):
                return

    async def _reap_loop(self) -> None:
        while not await self._closed_within(self._o.lease_s / 2.0):
            await leases.reap(self._q, self._m, self._o.engine_id)

    async def _closed_within(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True as soon as the worker is closing."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):  # as _wait_slot: no task per wait, as wait_for makes
                await self._closing.wait()
        return self._closing.is_set()
