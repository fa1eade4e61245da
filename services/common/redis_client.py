"""The asyncio Redis client every service uses.

Responses are decoded (every reader in Chimera expects ``str``), and the pool makes a burst of callers wait
for a free connection instead of failing: with redis-py's default pool the 101st concurrent command raised
"Too many connections", which the front door had to report as Redis being down.
"""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis

# How long a caller waits for a free connection before the pool gives up (then it is an outage).
POOL_WAIT_S = 10.0


def connect(url: str, max_connections: int) -> Redis:
    pool = BlockingConnectionPool.from_url(
        url, decode_responses=True, max_connections=max_connections, timeout=POOL_WAIT_S
    )
    return Redis.from_pool(pool)
