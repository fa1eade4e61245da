"""A real Redis Cluster for the tests: six ``redis-server`` processes on loopback (three masters, a replica
each), started once per session on free ports in a temporary folder. Test modules that need it import the
fixture (``from cluster_fixtures import redis_cluster``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.common.redis_cluster_proc import RedisClusterProcs, start_redis_cluster


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcs]:
    cluster = start_redis_cluster(Path(tmp_path_factory.mktemp("redis-cluster")))
    yield cluster
    cluster.stop()
