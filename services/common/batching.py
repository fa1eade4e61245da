"""An asyncio batch collector that runs model inference off the event loop, with hot reload.

NOTE(batching): callers ``await submit_many(items)``; a single collector task closes a batch when it holds
``max_batch_size`` items or ``max_wait_ms`` after its first item arrived, whichever comes first, and hands it
to an executor so inference never blocks the event loop (paper §4). The executor is a process pool
(``executor="process"``: inference that holds the GIL cannot slow the gRPC server) or a thread pool in the
serving process (``"thread"``: no pickling, no feeder and manager threads, no second process; the right choice
for models that spend their time in numpy, scikit-learn or torch, which release the GIL), or the event loop
itself (``"loop"``: for models that answer in well under a millisecond, such as the folded tf-idf heads and
flattened forests, where a thread hop, the batch window and the collector's own task switches cost more CPU
than the model; each call is then answered at once as its own batch, because those models work row by row and
gain nothing from company; the loop is blocked while it runs). ``"auto"`` picks per artifact: the loop for a
backend in ``loop_backends``, a thread pool for any other. A caller's items are never split across batches, so
one gRPC request is always answered by one artifact version. At most ``pool_workers`` batches run at once;
while all workers are busy, new requests wait in the collector and form the next (fuller) batch, which is the
back-pressure we want under load.

Hot reload: a watcher polls the artifact ``CURRENT`` pointer. On a change it builds a *new* pool whose
workers load the new version in their initializer (a thread pool's model is loaded once, off the loop),
waits until one worker has loaded it (a broken artifact is rejected here and the old pool keeps serving),
then switches new batches to it. The old pool is retired: it finishes the batches already handed to it and
is shut down when the last one returns, so no request is dropped or failed by a reload.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from services.common.artifacts import ArtifactMeta, CurrentWatcher, load_meta, load_version

log = logging.getLogger(__name__)

_MAX_RETRY_S = 60.0  # longest pause between attempts to load a version that failed to load

I = TypeVar("I")  # noqa: E741
R = TypeVar("R")

# (model, items) -> one result per item. Must be a module-level function: it is pickled to the workers.
BatchFn = Callable[[Any, list[I]], list[R]]
Loader = Callable[[Path, str], Any]


class NoArtifactError(Exception):
    """No artifact version is loaded yet (nothing published, or every version so far failed to load)."""


class CollectorClosedError(Exception):
    """The collector is shutting down and accepts no more work."""


class BatchShapeError(Exception):
    """The batch function returned a different number of results than it was given items."""


@dataclass(frozen=True, slots=True)
class Answer(Generic[R]):
    version: str  # the artifact version whose model computed these results
    results: tuple[R, ...]  # aligned with the submitted items


@dataclass(frozen=True, slots=True)
class BatchStat:
    size: int  # items in the batch
    requests: int  # submit calls merged into it
    latency_s: float  # from handing the batch to the pool until its results came back
    version: str
    ok: bool


# NOTE(worker-state): a ProcessPoolExecutor initializer cannot return anything, so each *worker process*
# keeps its loaded model here. This lives only in the pool's child processes (one model per process, set
# once by ``_init_worker``); the serving process never writes it.
_WORKER: dict[str, Any] = {}


def _init_worker(loader: Loader, fn: BatchFn[Any, Any], kind_dir: Path, version: str) -> None:
    # ``fn`` arrives here (not with every batch) so that its module is imported while the pool warms up.
    _WORKER["fn"] = fn
    _WORKER["model"] = loader(kind_dir, version)
    _WORKER["version"] = version


def _ping(hold_s: float) -> tuple[str, int]:
    # Holding the worker briefly lets concurrent pings reach the other workers instead of all landing on
    # the first one that is ready.
    time.sleep(hold_s)
    return str(_WORKER["version"]), os.getpid()


def _run_batch(items: list[Any]) -> list[Any]:
    return _WORKER["fn"](_WORKER["model"], items)  # type: ignore[no-any-return]


@dataclass(eq=False)
class _Pool:
    meta: ArtifactMeta
    executor: Executor | None  # None: batches run on the event loop
    # The loaded model, for a thread pool (it runs in this process); a process pool's workers hold their own.
    model: Any = None
    in_process: bool = False
    inflight: int = 0
    retired: bool = False
    broken: bool = False  # a worker process died: the executor refuses all further work
    stopping: bool = False


@dataclass(eq=False)
class _Pending(Generic[I, R]):
    items: list[I]
    future: asyncio.Future[Answer[R]]


@dataclass(frozen=True)
class CollectorOptions:
    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    pool_workers: int = 1
    executor: Literal["process", "thread", "loop", "auto"] = "process"
    # Backends cheap enough to run on the event loop when ``executor`` is "auto".
    loop_backends: frozenset[str] = frozenset()
    reload_interval_s: float = 2.0
    # "spawn" because forking a process that runs gRPC's threads is unsafe.
    mp_start_method: str = "spawn"
    # Seconds a new pool gets to load its artifact before the reload is abandoned.
    load_timeout_s: float = 120.0
    stats_maxlen: int = 2048
    on_batch: Callable[[BatchStat], None] | None = None
    on_reload: Callable[[ArtifactMeta], None] | None = None
    loader: Loader = field(default=load_version)


class BatchCollector(Generic[I, R]):
    """Collects submitted items into batches and runs ``batch_fn`` on the current artifact's model."""

    def __init__(self, kind_dir: Path, batch_fn: BatchFn[I, R], options: CollectorOptions) -> None:
        if options.max_batch_size < 1 or options.pool_workers < 1 or options.max_wait_ms < 0:
            raise ValueError("max_batch_size and pool_workers must be >= 1 and max_wait_ms >= 0")
        self._dir = kind_dir
        self._fn = batch_fn
        self._opt = options
        self._watcher = CurrentWatcher(kind_dir)
        self._pool: _Pool | None = None
        self._pending: deque[_Pending[I, R]] = deque()
        self._pending_items = 0
        self._wakeup = asyncio.Event()
        self._slots = asyncio.Semaphore(options.pool_workers)
        self._reload_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._background: list[asyncio.Task[Any]] = []
        self._retiring: set[asyncio.Task[Any]] = set()
        self._closed = False
        # (version, monotonic time of the next attempt, current backoff) of the last version that failed.
        self._failed: tuple[str, float, float] = ("", 0.0, 0.0)
        self.stats: deque[BatchStat] = deque(maxlen=options.stats_maxlen)

    @property
    def current(self) -> ArtifactMeta | None:
        """Metadata of the version new batches go to, or None before the first successful load."""
        return self._pool.meta if self._pool else None

    async def start(self) -> None:
        """Load the current artifact if there is one, then start the collector and the reload watcher."""
        await self.reload()
        self._background = [
            asyncio.create_task(self._collect(), name="batch-collector"),
            asyncio.create_task(self._watch(), name="artifact-watcher"),
        ]

    async def submit(self, item: I) -> tuple[str, R]:
        answer = await self.submit_many([item])
        return answer.version, answer.results[0]

    async def submit_many(self, items: Sequence[I]) -> Answer[R]:
        """Answer ``items`` in one batch (never split); raises the batch function's error if it fails."""
        if self._closed:
            raise CollectorClosedError("collector is closed")
        if self._pool is None:
            raise NoArtifactError(f"no artifact loaded from {self._dir}")
        if not items:
            return Answer(self._pool.meta.version, ())
        if self._pool.executor is None:
            return self._answer_now(self._pool, list(items))
        pending: _Pending[I, R] = _Pending(list(items), asyncio.get_running_loop().create_future())
        self._pending.append(pending)
        self._pending_items += len(pending.items)
        self._wakeup.set()
        return await pending.future

    async def reload(self) -> bool:
        """Switch to the version in ``CURRENT`` if it changed; True when a new version now serves."""
        async with self._reload_lock:
            version = self._watcher.poll()
            current = self._pool
            if version is None or self._closed:
                return False
            if current is not None and current.meta.version == version and not current.broken:
                return False
            failed, retry_at, backoff = self._failed
            if version == failed and time.monotonic() < retry_at:
                self._watcher.reset()  # look again at the next poll
                return False
            try:
                pool = await self._build_pool(version)
            except Exception as e:
                # Keep serving the old version; retry this one later, backing off to spare process spawns.
                backoff = min(2 * backoff, _MAX_RETRY_S) if version == failed else self._opt.reload_interval_s
                self._failed = (version, time.monotonic() + backoff, backoff)
                log.error("artifact %s in %s failed to load, keeping the old one: %s", version, self._dir, e)
                self._watcher.reset()
                return False
            self._failed = ("", 0.0, 0.0)
            old, self._pool = self._pool, pool
            log.info("serving artifact %s (%s) from %s", version, pool.meta.backend, self._dir)
            if old is not None:
                old.retired = True
                self._maybe_shutdown(old)
            if self._opt.on_reload:
                self._opt.on_reload(pool.meta)
            return True

    async def close(self) -> None:
        """Stop accepting work, fail anything still waiting, finish running batches, stop the pools."""
        self._closed = True
        for t in self._background:
            t.cancel()
        for t in self._background:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        while self._pending:
            p = self._pending.popleft()
            if not p.future.done():
                p.future.set_exception(CollectorClosedError("collector closed before the batch ran"))
        self._pending_items = 0
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._pool is not None:
            self._pool.retired = True
            self._maybe_shutdown(self._pool)
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)

    async def _build_pool(self, version: str) -> _Pool:
        meta = await asyncio.to_thread(load_meta, self._dir, version)
        executor = self._opt.executor
        if executor == "auto":
            executor = "loop" if meta.backend in self._opt.loop_backends else "thread"
        if executor in ("thread", "loop"):
            # A version that fails to load raises here, before anything serves from it.
            model = await asyncio.to_thread(self._opt.loader, self._dir, version)
            if executor == "loop":
                return _Pool(meta, None, model=model, in_process=True)
            threads = ThreadPoolExecutor(self._opt.pool_workers, thread_name_prefix="inference")
            return _Pool(meta, threads, model=model, in_process=True)
        processes = ProcessPoolExecutor(
            max_workers=self._opt.pool_workers,
            mp_context=multiprocessing.get_context(self._opt.mp_start_method),
            initializer=_init_worker,
            initargs=(self._opt.loader, self._fn, self._dir, version),
        )
        try:
            loop = asyncio.get_running_loop()

            # Rounds of concurrent pings until every worker answered: each has loaded the version before
            # the pool takes traffic, and a version that fails to load is rejected here.
            async def warm() -> None:
                pids: set[int] = set()
                while len(pids) < self._opt.pool_workers:
                    n = self._opt.pool_workers
                    pings = [loop.run_in_executor(processes, _ping, 0.05 if n > 1 else 0.0) for _ in range(n)]
                    for loaded, pid in await asyncio.gather(*pings):
                        if loaded != version:
                            raise RuntimeError(f"worker loaded {loaded}, expected {version}")
                        pids.add(pid)

            await asyncio.wait_for(warm(), timeout=self._opt.load_timeout_s)
        except BaseException:
            processes.shutdown(wait=False, cancel_futures=True)
            raise
        return _Pool(meta, processes)

    def _maybe_shutdown(self, pool: _Pool) -> None:
        if pool.retired and pool.inflight == 0 and not pool.stopping:
            pool.stopping = True
            if pool.executor is None:
                return
            # Blocking join of the worker processes, off the event loop.
            task = asyncio.create_task(asyncio.to_thread(pool.executor.shutdown, True))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._opt.reload_interval_s)
            try:
                await self.reload()
            except Exception:
                log.exception("artifact reload check failed")

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # Take a worker slot first: while every worker is busy, arrivals keep filling the next batch.
            await self._slots.acquire()
            try:
                while not self._pending:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                deadline = loop.time() + self._opt.max_wait_ms / 1000
                while self._pending_items < self._opt.max_batch_size:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    self._wakeup.clear()
                    try:
                        async with asyncio.timeout(remaining):  # no task per wait, unlike wait_for
                            await self._wakeup.wait()
                    except TimeoutError:
                        break
            except BaseException:
                self._slots.release()
                raise
            batch = self._take_batch()
            task = asyncio.create_task(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take_batch(self) -> list[_Pending[I, R]]:
        batch = [self._pending.popleft()]
        n = len(batch[0].items)
        while self._pending and n + len(self._pending[0].items) <= self._opt.max_batch_size:
            p = self._pending.popleft()
            batch.append(p)
            n += len(p.items)
        self._pending_items -= n
        return batch

    def _answer_now(self, pool: _Pool, items: list[I]) -> Answer[R]:
        """A call on a loop pool: its own batch, run before this returns (no window, no task, no hop)."""
        t0, ok = time.perf_counter(), False
        try:
            results = self._fn(pool.model, items)
            if len(results) != len(items):
                raise BatchShapeError(f"{len(results)} results for {len(items)} items")
            ok = True
            return Answer(pool.meta.version, tuple(results))
        finally:
            self._record(BatchStat(len(items), 1, time.perf_counter() - t0, pool.meta.version, ok))

    def _record(self, stat: BatchStat) -> None:
        self.stats.append(stat)
        if self._opt.on_batch:
            self._opt.on_batch(stat)

    async def _run(self, batch: list[_Pending[I, R]]) -> None:
        pool = self._pool
        assert pool is not None  # submit refuses work until a pool exists, and pools are never removed
        pool.inflight += 1
        items = [it for p in batch for it in p.items]
        t0 = time.perf_counter()
        ok = False
        try:
            loop = asyncio.get_running_loop()
            if pool.executor is None:  # queued before a reload switched to a loop pool
                results = self._fn(pool.model, items)
            elif pool.in_process:
                results = await loop.run_in_executor(pool.executor, self._fn, pool.model, items)
            else:
                results = await loop.run_in_executor(pool.executor, _run_batch, items)
            if len(results) != len(items):
                raise BatchShapeError(f"{len(results)} results for {len(items)} items")
            ok = True
        except Exception as e:
            if isinstance(e, BrokenProcessPool) and not pool.broken:
                # A worker died (e.g. killed for memory): rebuild the same version on the next poll.
                log.error("process pool for %s broke; rebuilding it", pool.meta.version)
                pool.broken = True
                self._watcher.reset()
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(e)
        else:
            start = 0
            for p in batch:
                end = start + len(p.items)
                if not p.future.done():
                    p.future.set_result(Answer(pool.meta.version, tuple(results[start:end])))
                start = end
        finally:
            pool.inflight -= 1
            self._slots.release()
            self._maybe_shutdown(pool)
            self._record(BatchStat(len(items), len(batch), time.perf_counter() - t0, pool.meta.version, ok))
