"""The private redis-server keeps its data: one killed outright and started again on the same folder
recovers it from its append-only file."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis

from services.common.redis_proc import PrivateRedisSpec, start_private_redis

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def test_a_killed_redis_restarted_on_its_folder_keeps_its_data(tmp_path: Path) -> None:
    first = start_private_redis(tmp_path)
    try:
        client = redis.Redis.from_url(first.url, decode_responses=True)
        client.set("survivor", "yes")
        client.zadd("queue", {"r1": 1.0, "r2": 2.0})
        client.close()
        time.sleep(1.5)  # past appendfsync everysec: the writes are on disk, not only with the OS
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(10)
    finally:
        first.stop()
    assert first.socket.exists(), "a killed server leaves its socket behind; the restart must cope"

    second = start_private_redis(tmp_path)
    try:
        assert second.url == first.url
        client = redis.Redis.from_url(second.url, decode_responses=True)
        assert client.get("survivor") == "yes"
        assert client.zrange("queue", 0, -1) == ["r1", "r2"]
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        client.close()
    finally:
        second.stop()


def test_the_spec_probes_a_stale_socket_as_down(tmp_path: Path) -> None:
    spec = PrivateRedisSpec(tmp_path)
    assert not spec.responds()  # no socket at all
    server = start_private_redis(tmp_path)
    assert spec.responds()
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(10)
    assert spec.socket.exists() and not spec.responds()
