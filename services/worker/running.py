"""One claimed request through the engine, from its claim to its final event: the deadline it must start
by, its text out through the publisher, its completion, or its failure with the status its caller gets.

The worker (``services.worker.worker``) decides what to claim and watches the engine's health; this runs what
it claimed. An engine death under a request goes back to the worker (``died_under``), which stops claiming
and hands the claim back; an error that may be the engine's own makes the worker probe it (``probe``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from redis.exceptions import RedisError
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from services.common.queue import DeltaItem, QueueStore
from services.worker import records
from services.worker.engine.base import (
    Engine,
    EngineDeadError,
    EngineOutput,
    EngineRequestError,
    EngineUnavailableError,
)
from services.worker.metrics import WorkerMetrics
from services.worker.options import Job, WorkerOptions
from services.worker.publisher import DeltaPublisher

log = logging.getLogger(__name__)


class JobRunner:
    def __init__(
        self,
        queue: QueueStore,
        engine: Engine,
        deltas: DeltaPublisher,
        metrics: WorkerMetrics,
        opts: WorkerOptions,
        abort: Callable[[Job], Awaitable[None]],
        died_under: Callable[[Job, str], None],
        probe: Callable[[], Awaitable[None]],
    ) -> None:
        self._q = queue
        self._engine = engine
        self._deltas = deltas
        self._m = metrics
        self._o = opts
        self._abort = abort
        self._died_under = died_under
        self._probe = probe
        self.completed = 0

    async def run(self, job: Job) -> None:
        """Run ``job`` to its end. A failure of the request is written to its stream, not raised."""
        c = job.claimed
        req = c.request
        try:
            if req.deadline_unix is not None and time.time() > req.deadline_unix:
                late = time.time() - req.deadline_unix
                await self._q.fail(
                    c, "DEADLINE_EXCEEDED", f"deadline passed {late:.3f} s before it could start"
                )
                self._m.ended("deadline_exceeded")
                return
            t0 = time.time()
            try:
                async with asyncio.timeout(self._o.max_run_s):
                    final, text = await self._generate(job)
            except TimeoutError:
                await self._abort(job)
                await self._q.fail(c, "DEADLINE_EXCEEDED", f"ran longer than {self._o.max_run_s:g} s")
                self._m.ended("deadline_exceeded")
                return
            run_s = time.time() - t0
            if job.lost:
                log.info("request %s: lease lost, dropped", job.key)
                self._m.ended("lost")
                return
            job.finishing = True
            await self._complete(job, final, text, run_s)
        except EngineDeadError as exc:
            log.error("engine died while running %s: %s", job.key, exc)
            self._died_under(job, str(exc))
        except EngineRequestError as exc:
            log.warning("engine refused %s: %s", job.key, exc)
            self._m.ended("failed")
            with contextlib.suppress(RedisError):
                await self._q.fail(c, "INVALID_ARGUMENT", str(exc))
        except EngineUnavailableError as exc:
            log.warning("engine could not serve %s: %s", job.key, exc)
            self._m.engine_error("request")
            self._m.ended("failed")
            with contextlib.suppress(RedisError):
                await self._q.fail(c, "UNAVAILABLE", str(exc))
            await self._probe()
        except Exception as exc:
            log.exception("request %s failed", job.key)
            self._m.engine_error("request")
            self._m.ended("failed")
            with contextlib.suppress(RedisError):
                await self._q.fail(c, "INTERNAL", f"{type(exc).__name__}: {exc}")
            await self._probe()  # an error that is not the request's may be the engine's death

    async def _generate(self, job: Job) -> tuple[EngineOutput, str]:
        """Run the request on the engine, its text going out through the publisher (unless its caller
        reads only the final event: ``StageRequest.stream``). Returns the final output and the whole text."""
        c = job.claimed
        parts: list[str] = []
        final: EngineOutput | None = None
        started = not c.request.stream  # a request nobody streams never flushes a first token
        job.started = True
        if job.cancel or job.lost:  # cancelled (or re-queued) between its claim and its start: never run
            return EngineOutput("", True, "cancelled"), ""
        async for out in self._engine.generate(c.request, job.key, c.predicted):
            if final is not None:
                continue
            if (job.lost or job.cancel) and not job.aborted:
                await self._abort(job)  # the renewal saw it before the engine knew the request
            if c.request.stream and (out.text_delta or out.tool_pieces):
                self._deltas.add(job, out.text_delta, out.tool_pieces)
                if not started:
                    # The first token at once: coalescing never delays it. Refused by Redis, its text was
                    # put back and goes out with the next flush.
                    with contextlib.suppress(RedisError):
                        await self._deltas.flush(job)
                    started = True
            parts.append(out.text_delta)
            if out.finished:
                final = out
        if final is None:
            raise RuntimeError("the engine's stream ended without a finished output")
        return final, "".join(parts)  # its last deltas go out with its final event (_complete)

    async def _complete(self, job: Job, final: EngineOutput, text: str, run_s: float) -> None:
        c, engine_id, model = job.claimed, self._o.engine_id, self._engine.model
        result = records.stage_result(final, text)
        trace = records.trace_row(c, result, engine_id, model, run_s)
        extra = records.final_extra(c, engine_id, model, run_s)

        async def complete(last: list[DeltaItem]) -> bool:
            # Redis away for a moment (a restart, a failover) must not fail a finished answer: the same
            # completion, its last deltas with it, is sent again (COMPLETE writes once).
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(RedisError),
                stop=stop_after_delay(self._o.lease_s * 2),
                wait=wait_exponential(multiplier=0.1, max=1.0),
                reraise=True,
            ):
                with attempt:
                    return await self._q.complete(c, result, trace, extra, last)
            raise AssertionError("unreachable: the retry loop returns or raises")

        done = await self._deltas.flush_with(job, complete)
        if done:
            self.completed += 1
            self._m.completed(result.finish_reason, run_s, result.completion_tokens)
        else:
            log.info("request %s: lease lost before completion, result dropped", job.key)
            self._m.ended("lost")
