"""The batch collector: batching by size and by timeout, error fan-out, and lossless hot reload.

The "models" here are fake ones: plain dicts published as artifacts, run by ``tag_batch`` below, which
the pool's worker processes import from this module.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from services.common import artifacts
from services.common.batching import (
    BatchCollector,
    CollectorClosedError,
    CollectorOptions,
    NoArtifactError,
)

pytestmark = pytest.mark.unit


def tag_batch(model: dict[str, Any], items: list[str]) -> list[str]:
    """Fake model: answers each item with the artifact's tag; fails the whole batch on "boom"."""
    time.sleep(model.get("sleep", 0.0))
    if "boom" in items:
        raise ValueError("boom in batch")
    return [f"{model['tag']}:{x}" for x in items]


def publish_fake(kind_dir: Path, tag: str, sleep: float = 0.0) -> str:
    meta = artifacts.publish(
        kind_dir,
        {"tag": tag, "sleep": sleep},
        kind="fake",
        backend="fake",
        data_hash=artifacts.data_hash([tag]),
        rows=0,
        models=(),
    )
    return meta.version


@pytest.fixture
async def make_collector(tmp_path: Path) -> AsyncIterator[Any]:
    made: list[BatchCollector[str, str]] = []

    async def make(**kw: Any) -> BatchCollector[str, str]:
        c: BatchCollector[str, str] = BatchCollector(tmp_path, tag_batch, CollectorOptions(**kw))
        await c.start()
        made.append(c)
        return c

    yield make
    for c in made:
        await asyncio.wait_for(c.close(), 30)
    assert not multiprocessing.active_children()  # close() joined every worker process


@pytest.mark.parametrize(("executor", "sizes"), [("thread", [4, 4]), ("loop", [1] * 8)])
async def test_errors_and_batches_on_the_loop_as_in_a_thread(
    tmp_path: Path, make_collector: Any, executor: str, sizes: list[int]
) -> None:
    """Threads batch concurrent calls in the window; the loop answers each call at once, on its own."""
    publish_fake(tmp_path, "v1")
    c = await make_collector(max_batch_size=4, max_wait_ms=50, executor=executor)
    answers = await asyncio.wait_for(asyncio.gather(*(c.submit(str(i)) for i in range(8))), 20)
    assert [a for _, a in answers] == [f"v1:{i}" for i in range(8)]
    assert sorted(s.size for s in c.stats) == sizes
    with pytest.raises(ValueError, match="boom"):
        await asyncio.wait_for(c.submit("boom"), 20)


def thread_batch(model: dict[str, Any], items: list[str]) -> list[int]:
    return [threading.get_ident() for _ in items]


@pytest.mark.parametrize(("loop_backends", "on_loop"), [(frozenset({"fake"}), True), (frozenset(), False)])
async def test_auto_runs_cheap_backends_on_the_loop(
    tmp_path: Path, loop_backends: frozenset[str], on_loop: bool
) -> None:
    publish_fake(tmp_path, "v1")
    opts = CollectorOptions(executor="auto", loop_backends=loop_backends)
    c: BatchCollector[str, int] = BatchCollector(tmp_path, thread_batch, opts)
    await c.start()
    try:
        _, ident = await asyncio.wait_for(c.submit("a"), 20)
        assert (ident == threading.get_ident()) is on_loop
    finally:
        await c.close()


async def test_batches_close_at_max_size(tmp_path: Path, make_collector: Any) -> None:
    publish_fake(tmp_path, "v1")
    c = await make_collector(max_batch_size=4, max_wait_ms=2000, reload_interval_s=60)
    t0 = time.perf_counter()
    answers = await asyncio.wait_for(asyncio.gather(*(c.submit(str(i)) for i in range(8))), 20)
    # Two full batches close without waiting for the 2 s timeout.
    assert time.perf_counter() - t0 < 1.5
    assert [r for _, r in answers] == [f"v1:{i}" for i in range(8)]
    assert [s.size for s in c.stats] == [4, 4]


async def test_batch_closes_at_timeout(tmp_path: Path, make_collector: Any) -> None:
    publish_fake(tmp_path, "v1")
    c = await make_collector(max_batch_size=32, max_wait_ms=150, reload_interval_s=60)
    t0 = time.perf_counter()
    answers = await asyncio.wait_for(asyncio.gather(c.submit("a"), c.submit("b")), 20)
    assert time.perf_counter() - t0 >= 0.14
    assert sorted(r for _, r in answers) == ["v1:a", "v1:b"]
    assert [s.size for s in c.stats] == [2]
    assert c.stats[0].requests == 2 and c.stats[0].ok


@pytest.mark.parametrize("executor", ["process", "thread"])
async def test_workers_run_batches_in_parallel(tmp_path: Path, make_collector: Any, executor: str) -> None:
    publish_fake(tmp_path, "v1", sleep=1.0)
    c = await make_collector(
        max_batch_size=2, max_wait_ms=1, pool_workers=2, reload_interval_s=60, executor=executor
    )
    t0 = time.perf_counter()
    answers = await asyncio.wait_for(asyncio.gather(*(c.submit(str(i)) for i in range(4))), 20)
    # Two batches of two, each sleeping 1 s: in parallel they take ~1 s, one after another 2 s. The margin
    # is wide because a loaded machine delays a batch's start by a few hundred ms (seen: 0.35 s).
    assert time.perf_counter() - t0 < 1.7, list(c.stats)
    assert sorted(r for _, r in answers) == [f"v1:{i}" for i in range(4)]
    assert [s.size for s in c.stats] == [2, 2]


async def test_one_callers_items_stay_together(tmp_path: Path, make_collector: Any) -> None:
    publish_fake(tmp_path, "v1")
    c = await make_collector(max_batch_size=3, max_wait_ms=5, reload_interval_s=60)
    big = [str(i) for i in range(7)]
    small = await asyncio.wait_for(asyncio.gather(c.submit_many(big), c.submit_many(["x", "y"])), 20)
    assert small[0].results == tuple(f"v1:{i}" for i in big)
    assert small[1].results == ("v1:x", "v1:y")
    assert sorted(s.size for s in c.stats) == [2, 7]  # an oversized request runs alone, unsplit


@pytest.mark.parametrize("executor", ["process", "thread"])
async def test_errors_reach_every_caller_of_the_batch(
    tmp_path: Path, make_collector: Any, executor: str
) -> None:
    publish_fake(tmp_path, "v1")
    c = await make_collector(max_batch_size=8, max_wait_ms=100, reload_interval_s=60, executor=executor)
    results = await asyncio.wait_for(
        asyncio.gather(c.submit("a"), c.submit("boom"), c.submit("b"), return_exceptions=True), 20
    )
    assert all(isinstance(r, ValueError) for r in results), results
    assert not c.stats[-1].ok
    # The pool survives a failing batch.
    assert (await asyncio.wait_for(c.submit("c"), 20))[1] == "v1:c"


async def test_no_artifact_then_first_publish(tmp_path: Path, make_collector: Any) -> None:
    c = await make_collector(reload_interval_s=0.05)
    assert c.current is None
    with pytest.raises(NoArtifactError):
        await c.submit("a")
    version = publish_fake(tmp_path, "v1")
    deadline = time.monotonic() + 30
    while c.current is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert c.current is not None and c.current.version == version
    assert await asyncio.wait_for(c.submit("a"), 20) == (version, "v1:a")


@pytest.mark.parametrize("executor", ["process", "thread", "loop"])
async def test_broken_artifact_keeps_old_version(tmp_path: Path, make_collector: Any, executor: str) -> None:
    good = publish_fake(tmp_path, "v1")
    c = await make_collector(reload_interval_s=60, executor=executor)
    bad = publish_fake(tmp_path, "v2")
    (tmp_path / f"{bad}.joblib").write_bytes(b"garbage")
    assert await asyncio.wait_for(c.reload(), 60) is False
    assert c.current is not None and c.current.version == good
    assert await asyncio.wait_for(c.submit("a"), 20) == (good, "v1:a")
    assert await asyncio.wait_for(c.reload(), 60) is False  # backing off, old version still serves
    fixed = publish_fake(tmp_path, "v3")
    assert await asyncio.wait_for(c.reload(), 60) is True
    assert await asyncio.wait_for(c.submit("a"), 20) == (fixed, "v3:a")


@pytest.mark.parametrize("executor", ["process", "thread", "loop"])
async def test_hot_reload_under_load_drops_nothing(
    tmp_path: Path, make_collector: Any, executor: str
) -> None:
    v1 = publish_fake(tmp_path, "v1", sleep=0.01)
    c = await make_collector(max_batch_size=8, max_wait_ms=2, reload_interval_s=0.05, executor=executor)
    calls: list[tuple[int, bool, asyncio.Task[tuple[str, str]]]] = []

    def fire(i: int) -> None:
        # Remember whether v2 already served new batches when this call was submitted.
        switched = c.current is not None and c.current.version != v1
        calls.append((i, switched, asyncio.create_task(c.submit(str(i)))))

    for i in range(100):
        fire(i)
        await asyncio.sleep(0.002)
    v2 = publish_fake(tmp_path, "v2", sleep=0.01)
    deadline = time.monotonic() + 45
    i = 100
    # Keep the load on while the new pool starts ...
    while i < 150 and c.current.version == v1 and time.monotonic() < deadline:
        fire(i)
        i += 1
        await asyncio.sleep(0.02)
    while c.current.version == v1 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert c.current.version == v2
    # ... and after the switch.
    while i < 200:
        fire(i)
        i += 1
        await asyncio.sleep(0.002)
    results = await asyncio.wait_for(asyncio.gather(*(t for _, _, t in calls)), 60)
    assert len(results) == 200
    for (version, answer), (n, _, _) in zip(results, calls, strict=True):
        assert answer == f"{'v2' if version == v2 else 'v1'}:{n}"
    versions = {v for v, _ in results}
    assert versions == {v1, v2}
    assert all(v == v2 for (v, _), (_, switched, _) in zip(results, calls, strict=True) if switched)
    assert any(switched for _, switched, _ in calls)
    assert {s.version for s in c.stats} == {v1, v2} and all(s.ok for s in c.stats)
    # The retired pool shuts down once its last batch returned: one worker process is left (none for
    # threads, which never start one).
    left = 1 if executor == "process" else 0
    deadline = time.monotonic() + 20
    while len(multiprocessing.active_children()) > left and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert len(multiprocessing.active_children()) == left


async def test_closed_collector_refuses_work(tmp_path: Path) -> None:
    publish_fake(tmp_path, "v1")
    c: BatchCollector[str, str] = BatchCollector(tmp_path, tag_batch, CollectorOptions(reload_interval_s=60))
    await c.start()
    await asyncio.wait_for(c.close(), 30)
    with pytest.raises(CollectorClosedError):
        await c.submit("a")
