"""The asyncio Redis clients every service uses.

Responses are decoded (every reader in Chimera expects ``str``), and the pool makes a burst of callers wait
for a free connection instead of failing: with redis-py's default pool the 101st concurrent command raised
"Too many connections", which the front door had to report as Redis being down.

NOTE(outage): every command is retried with jittered exponential backoff for ``outage_s`` when the
connection fails, so a Redis restart (the supervisor brings it back within a second or two, AOF reloads its
data) is a pause, not an error, for every caller. A command retried after its first send did reach Redis
runs twice; the scripts that could not bear that are idempotent (ENQUEUE checks the id, PUBLISH the
delta's offset, COMPLETE the attempt), and a CLAIM whose answer was lost leaves a lease that expires and
re-queues the request.

A ``redis+cluster://`` URL gives redis-py's cluster client instead, with the same decoding, connection
bound (per node) and outage behaviour (``services.common.redis_cluster``). Both are typed as the plain
client: Chimera uses only commands that both offer, single-slot scripts and pipelines without cross-slot
transactions, and the few places that must do otherwise ask ``is_cluster``.
"""

from __future__ import annotations

import math
from typing import Any, cast

import redis
import redis.cluster
from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import EqualJitterBackoff

from services.common.redis_cluster import async_cluster, is_cluster_url, sync_cluster
from services.common.redis_conn import cancel_safe

# How long a caller waits for a free connection before the pool gives up (then it is an outage).
POOL_WAIT_S = 10.0
# Ride out a Redis restart this long by default (the supervisor restarts it after 0.5 s; loading takes ms).
DEFAULT_OUTAGE_S = 15.0
_BACKOFF_BASE_S, _BACKOFF_CAP_S = 0.05, 1.0
# A cluster reader holds one blocking read per engine on the node that owns the engine's slot.
_READER_NODE_CONNECTIONS = 1024
_TOOL_NODE_CONNECTIONS = 16


def outage_retry(outage_s: float) -> Retry:
    """A retry that keeps trying for at least ``outage_s``: the backoff doubles from 50 ms up to 1 s, each
    wait jittered between half and all of it, so that every client does not reconnect at the same instant."""
    doubling = math.ceil(math.log2(_BACKOFF_CAP_S / _BACKOFF_BASE_S))  # tries before the cap
    ramp_s = _BACKOFF_BASE_S * (2**doubling - 1) / 2  # the shortest the ramp can take
    retries = doubling + max(0, math.ceil((outage_s - ramp_s) / (_BACKOFF_CAP_S / 2)))
    return Retry(EqualJitterBackoff(cap=_BACKOFF_CAP_S, base=_BACKOFF_BASE_S), retries)


def connect(url: str, max_connections: int, outage_s: float = DEFAULT_OUTAGE_S) -> Redis:
    if is_cluster_url(url):
        # A burst past the per-node bound is retried with the outage's backoff: it waits, as the pool does.
        return cast(Redis, async_cluster(url, max_connections, outage_retry(outage_s), outage_s))
    pool = BlockingConnectionPool.from_url(
        url,
        decode_responses=True,
        max_connections=max_connections,
        timeout=POOL_WAIT_S,
        retry=outage_retry(outage_s),
    )
    return Redis.from_pool(cancel_safe(pool))


def connect_reader(url: str, outage_s: float = DEFAULT_OUTAGE_S) -> Redis:
    """One connection for a long blocking read (the stream hub), never one of the pool's.

    On a cluster, one connection per notify stream the hub reads (see ``services.dispatcher.hub``)."""
    if is_cluster_url(url):
        return cast(Redis, async_cluster(url, _READER_NODE_CONNECTIONS, outage_retry(outage_s), outage_s))
    retry = outage_retry(outage_s)
    pool = ConnectionPool.from_url(url, decode_responses=True, max_connections=1, retry=retry)
    return Redis.from_pool(cancel_safe(pool))


def connect_tool(url: str) -> Redis:
    """An asyncio client for a short-lived tool (a CLI, a report): ``Redis.from_url`` with decoded responses,
    or the cluster client for a cluster URL."""
    if is_cluster_url(url):
        return cast(Redis, async_cluster(url, _TOOL_NODE_CONNECTIONS, outage_retry(0.0), 0.0))
    return Redis.from_pool(cancel_safe(ConnectionPool.from_url(url, decode_responses=True)))


def connect_sync(url: str, **options: Any) -> redis.Redis:
    """A blocking client (CLIs, jobs, probes, benchmarks): ``redis.Redis.from_url`` with decoded responses,
    or the cluster client for a cluster URL. ``options``: any other client option (timeouts)."""
    options.setdefault("decode_responses", True)
    if is_cluster_url(url):
        return cast(redis.Redis, sync_cluster(url, **options))
    return redis.Redis.from_url(url, **options)


def is_cluster(client: object) -> bool:
    """Whether ``client`` talks to a Redis Cluster (multi-key commands must stay within one slot)."""
    return isinstance(client, AsyncRedisCluster | redis.cluster.RedisCluster)
