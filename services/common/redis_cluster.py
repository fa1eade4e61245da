"""Redis Cluster behind the same setting as a single Redis: ``CHIMERA_REDIS_URL=redis+cluster://...``.

``redis+cluster://[user:password@]host:port[,host:port...][?option=value...]`` (``rediss+cluster://`` for
TLS) names some of a cluster's nodes; the client discovers the rest and follows the slots as they move.
Every service builds its clients through ``services.common.redis_client``, which returns redis-py's cluster
client for such a URL and the plain one for any other.

NOTE(cluster-retry): redis-py's cluster client retries a failed command only as many times as its
``retry`` says and with no pause in between (its ``Retry`` is "not yet fully utilized", in its own
words): during a failover, while the dead master still owns its slots, every retry fails again at once. So
``OutageCluster`` wraps each command in the same jittered backoff as a single Redis client
(``outage_retry``), letting the inner loop retry once (a topology refresh after MOVED or a dropped
connection). Pipelines cannot be wrapped that way (redis-py empties a pipeline when its execute ends), so
they keep redis-py's own loop, which does pause 0.25 s and refresh the topology between tries: they get as
many tries as cover the same outage.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import redis
import redis.cluster
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.exceptions import ClusterDownError, SlotNotCoveredError, TryAgainError

from services.common.redis_conn import cancel_safe_class

CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
# redis-py's cluster pipeline sleeps this long between its tries (a constant inside redis-py).
_PIPELINE_PAUSE_S = 0.25
# What a failover looks like to a client, besides a dropped connection: the cluster reports itself down or
# a slot uncovered until a replica is promoted, or asks to try again while a slot moves.
_FAILOVER_ERRORS = (ClusterDownError, SlotNotCoveredError, TryAgainError)


def is_cluster_url(url: str) -> bool:
    return url.startswith(CLUSTER_SCHEMES)


@dataclass(frozen=True, slots=True)
class ClusterTarget:
    """A cluster URL, parsed: the nodes to start from and the connection options shared by every node."""

    nodes: tuple[tuple[str, int], ...]
    options: dict[str, Any]

    @classmethod
    def parse(cls, url: str) -> ClusterTarget:
        if not is_cluster_url(url):
            raise ValueError(f"not a Redis Cluster URL (expected {' or '.join(CLUSTER_SCHEMES)}): {url!r}")
        scheme, rest = url.split("://", 1)
        netloc, sep, tail = rest.partition("/")
        netloc, qsep, query = netloc.partition("?")
        if sep and tail.partition("?")[0] not in ("", "0"):
            raise ValueError("a Redis Cluster has only database 0")
        if sep:
            query = tail.partition("?")[2]
        userinfo, at, hosts = netloc.rpartition("@")
        nodes = tuple(_host_port(h) for h in hosts.split(",") if h)
        if not nodes:
            raise ValueError(f"a Redis Cluster URL names at least one host:port: {url!r}")
        # The options (credentials, TLS, timeouts) are those of a one-node URL: redis-py parses them.
        plain = f"{scheme.split('+')[0]}://{userinfo}{at}{hosts.split(',')[0]}{'/?' + query if query else ''}"
        parsed: dict[str, Any] = parse_url(plain)  # type: ignore[no-untyped-call]
        options = {k: v for k, v in parsed.items() if k not in ("host", "port", "db", "path")}
        if options.pop("connection_class", None) is not None:  # only set for rediss://
            options["ssl"] = True
        return cls(nodes, options)


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = unquote(text).rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"a Redis Cluster node is host:port, not {text!r}")
    return host.strip("[]"), int(port)


class _CommandRetries(AsyncRetry):
    """redis-py's own retry count: one for a single command (``OutageCluster`` backs off around it), enough
    for the outage for a pipeline. Which one is asked for is marked per task by ``OutageCluster``."""

    def __init__(self, pipeline_retries: int, single: ContextVar[bool]) -> None:
        super().__init__(NoBackoff(), pipeline_retries)
        self._single = single

    def get_retries(self) -> int:
        return 1 if self._single.get() else super().get_retries()


class OutageCluster(AsyncRedisCluster):
    """The asyncio cluster client with a single Redis client's outage behaviour (see the module's note)."""

    def __init__(self, outage: AsyncRetry, outage_s: float, **kwargs: Any) -> None:
        # One marker per client (a handful per process), so that two clients never share it.
        single: ContextVar[bool] = ContextVar(f"chimera-cluster-{id(self)}", default=False)
        retries = _CommandRetries(max(1, math.ceil(outage_s / _PIPELINE_PAUSE_S)), single)
        super().__init__(retry=retries, **kwargs)
        # The client picks its connection class itself: swap in the cancel-safe one (NOTE(cancel) in
        # redis_conn) for the startup nodes, and in the arguments that nodes found later are made with.
        safe = cancel_safe_class(self.connection_kwargs["connection_class"])
        self.connection_kwargs["connection_class"] = safe
        for node in self.startup_nodes:
            node.connection_class = safe  # type: ignore[assignment]
        outage.update_supported_errors(list(_FAILOVER_ERRORS))  # type: ignore[arg-type]
        self._outage, self._single = outage, single

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        token = self._single.set(True)
        try:
            return await self._outage.call_with_retry(
                lambda: super(OutageCluster, self).execute_command(*args, **kwargs), _ignore
            )
        finally:
            self._single.reset(token)


async def _ignore(_error: Exception) -> None:
    """Nothing to undo between tries: the cluster client already dropped the failed node's connections."""


def async_cluster(
    url: str, max_connections: int, outage: AsyncRetry, outage_s: float, **extra: Any
) -> OutageCluster:
    """The asyncio client of the cluster ``url`` names; at most ``max_connections`` per node."""
    target = ClusterTarget.parse(url)
    return OutageCluster(
        outage,
        outage_s,
        startup_nodes=[AsyncClusterNode(h, p) for h, p in target.nodes],
        decode_responses=True,
        max_connections=max_connections,
        **(target.options | extra),
    )


def sync_cluster(url: str, **extra: Any) -> redis.cluster.RedisCluster:
    """The blocking client of the cluster ``url`` names (the CLIs, the jobs, the launcher's probes)."""
    target = ClusterTarget.parse(url)
    return redis.cluster.RedisCluster(
        startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in target.nodes],  # type: ignore[no-untyped-call]
        **(target.options | extra),
    )


def startup_nodes_url(nodes: Sequence[tuple[str, int]], tls: bool = False) -> str:
    """The cluster URL of ``nodes`` (how the tests and the benchmark hand their cluster to a stack)."""
    scheme = CLUSTER_SCHEMES[1] if tls else CLUSTER_SCHEMES[0]
    return scheme + ",".join(f"{h}:{p}" for h, p in nodes)
