"""Chimera on a real three-master Redis Cluster (``CHIMERA_REDIS_URL=redis+cluster://...``): the queue
scripts and pipelines on engines whose slots live on different masters, the stream hub's per-engine reads,
SCAN over every master, and the whole stack's workflows, through the kill -9 of a master under load."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cluster_fixtures import redis_cluster
from redis.asyncio import Redis
from worker_procs import stage_request

from bench.faults.scaleout import ScaleoutConfig, scenario
from bench.faults.stack import StackConfig, pool
from services.common.keys import Keys
from services.common.queue import QueueStore
from services.common.redis_client import connect, connect_reader, connect_sync, is_cluster
from services.common.redis_cluster import ClusterTarget
from services.common.redis_cluster_proc import RedisClusterProcs
from services.common.redis_conn import CancelSafeConnection
from services.common.types import Prediction, StageResult
from services.dispatcher.hub import StreamHub
from services.inspect.queue_view import queue_view
from services.launcher.config import LauncherSettings
from services.launcher.stack import running_stack

__all__ = ["redis_cluster"]  # the session fixture, imported for pytest to find


@pytest.mark.unit
def test_a_cluster_url_names_its_nodes_and_keeps_its_options() -> None:
    t = ClusterTarget.parse("redis+cluster://app:s%40cret@10.0.0.1:7000,10.0.0.2:7001?socket_timeout=3")
    assert t.nodes == (("10.0.0.1", 7000), ("10.0.0.2", 7001))
    assert t.options["username"] == "app" and t.options["password"] == "s@cret"
    assert t.options["socket_timeout"] == 3.0
    assert ClusterTarget.parse("rediss+cluster://h:1").options["ssl"] is True
    for bad in ("redis://h:1", "redis+cluster://h", "redis+cluster://h:1/2"):
        with pytest.raises(ValueError):
            ClusterTarget.parse(bad)


@pytest.fixture
async def cluster_client(redis_cluster: RedisClusterProcs) -> AsyncIterator[Redis]:
    client = connect(redis_cluster.url, max_connections=16)
    assert is_cluster(client)
    yield client
    await client.aclose()


async def test_the_cluster_client_connects_with_cancel_safe_connections(cluster_client: Redis) -> None:
    # NOTE(cancel) in services.common.redis_conn: the cluster client picks its connection class itself.
    await cluster_client.set("cancel-safe-probe", "1")
    nodes = cluster_client.get_nodes()  # type: ignore[attr-defined]
    assert nodes and {n.connection_class for n in nodes} == {CancelSafeConnection}
    assert {type(c) for n in nodes for c in n._free} <= {CancelSafeConnection}
    await cluster_client.delete("cancel-safe-probe")


def _engines_on_two_masters(cluster: RedisClusterProcs, keys: Keys) -> tuple[str, str]:
    """Two engine ids whose slots are served by different masters."""
    first = "e0"
    for i in range(1, 64):
        if cluster.owner(keys.queue(f"e{i}")) != cluster.owner(keys.queue(first)):
            return first, f"e{i}"
    raise AssertionError("every engine id hashed to one master")


@pytest.mark.redis
@pytest.mark.timeout(60)
async def test_queues_pipelines_hub_and_scan_on_a_cluster(
    redis_cluster: RedisClusterProcs, cluster_client: Redis, keys: Keys
) -> None:
    store = QueueStore(cluster_client, keys)
    engines = _engines_on_two_masters(redis_cluster, keys)
    reader = connect_reader(redis_cluster.url)
    hub = StreamHub(store, reader, block_ms=5000)
    try:
        for n, engine in enumerate(engines):
            rid, pid = f"r{n}", f"p{n}"
            # ASSIGN (the program's slot) and the duplicate check (the engine's) in one pipeline.
            assert await store.assign(pid, engine, "m", "wf", 0, rid, 60, {"m": 0.5}) == (
                False,
                ("new", engine, "m"),
            )
            req = stage_request(rid, program_id=pid)
            assert await store.enqueue(engine, req, Prediction(5, 9), 1.0, time.time(), {})
            [claimed] = await store.claim(engine, "w", 1, lease_s=30)
            async with hub.subscribe(engine, rid) as sub:
                t0 = time.perf_counter()
                assert await store.publish_deltas(engine, [(rid, 1, "hel", 3), (rid, 1, "hel", 3)]) == [
                    True,
                    False,
                ]
                assert [e.data["text"] for e in await hub.next(sub, 5.0)] == ["hel"]
                # The other engine's read stays blocked meanwhile: this one answers well within its block.
                assert time.perf_counter() - t0 < 2.0
                assert await store.complete(claimed, StageResult("hello", "stop", 2, 2), None)
                finals = [e for e in await hub.next(sub, 5.0) if e.data["t"] == "final"]
                assert finals and finals[0].data["text"] == "hello"
            assert await cluster_client.hget(keys.program(pid), "attained") == "2"
        # Programs hash to every master: SCAN visits them all.
        view = await queue_view(cluster_client, keys, now=time.time())
        assert view is not None
        found = {k async for k in cluster_client.scan_iter(match=keys.program_pattern(), count=100)}
        assert found == {keys.program("p0"), keys.program("p1")}
    finally:
        await hub.stop()
        await reader.aclose()


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_workflows_run_on_a_cluster_and_survive_a_master_failover(
    redis_cluster: RedisClusterProcs, tmp_path: Path
) -> None:
    """The launcher's stack on the cluster: a batch of multi-stage streaming workflows through the SDK, then
    a batch during which the master of the small engine's slot is SIGKILLed and its replica promoted.
    Every workflow completes, none is lost or duplicated, and the accounting drains to zero."""
    cfg = ScaleoutConfig(steady_workflows=6, failover_workflows=12, stack=StackConfig(time_scale=4.0))
    settings = LauncherSettings.ephemeral(tmp_path, redis_url=redis_cluster.url, start_timeout_s=120)
    with running_stack(settings, pool(cfg.stack)) as stack:
        res = asyncio.run(scenario(stack, redis_cluster, cfg))
    for phase in ("steady", "failover"):
        c = res[phase]["counts"]
        assert (c["completed"], c["lost"], c["duplicated_workflows"]) == (c["started"], 0, 0), (phase, c)
        assert res[phase]["residue"] == {}, res[phase]
    f = res["failover"]["failover"]
    assert f["promoted_after_s"] is not None, f
    assert 0 < f["stages_answered_before_fault"] < res["failover"]["stages_planned"], f
    assert "victim_rejoined_as_replica_after_s" in f
    client = connect_sync(redis_cluster.url)
    try:
        assert client.ping()
    finally:
        client.close()
