"""Health checks shared by the launcher (waiting for its children) and the container health checks.

Each returns None when healthy and the reason otherwise, so that a caller polling during start-up can stay
quiet while a one-shot container check prints why it failed.
"""

from __future__ import annotations

import time
from typing import Any, cast

import grpc
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.keys import EngineField, EngineHealth, Keys
from services.common.startup import StartupState
from services.common.tls import ClientTls, sync_channel


def grpc_unhealthy(
    addr: str, timeout_s: float = 2.0, service: str = "", transport: ClientTls | None = None
) -> str | None:
    """Why the gRPC server at ``addr`` is not SERVING (grpc.health.v1), or None. ``transport``: how to reach
    a server that serves TLS (and may ask for a client certificate)."""
    try:
        with sync_channel(addr, transport) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
    except grpc.RpcError as e:
        return f"{addr}: {e.code()}"
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return f"{addr}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
    return None


def heartbeat_unhealthy(r: redis.Redis, keys: Keys, engine: str, max_age_s: float) -> str | None:
    """Why the engine's worker is not healthy, or None: its heartbeat is missing or older than
    ``max_age_s``, or the heartbeat itself says the engine is dead (its worker saw it die and is exiting)."""
    f = EngineField
    try:
        raw = r.hmget(keys.engine_info(engine), [f.HEARTBEAT_MS, f.HEALTH, f.HEALTH_REASON])
    except redis.RedisError as e:
        return f"redis: {e}"
    # Callers' clients may or may not decode responses (the launcher's probe does not).
    beat, health, reason = (v.decode() if isinstance(v, bytes) else v for v in cast(list[Any], raw))
    # A worker older than the health field reports none: its heartbeat's age alone decides.
    if health is not None and health != EngineHealth.OK:
        return f"engine {engine} is {health}: {reason or 'no reason given'}"
    if beat is None:
        # Still starting: say which step it is at (downloading, converting, profiling...), not just "no".
        starting = StartupState.from_mapping(r.hgetall(keys.engine_startup(engine)))
        if starting is not None:
            return f"engine {engine} is starting: {starting.describe()}"
        return f"engine {engine} has no heartbeat"
    age_s = time.time() - float(beat) / 1000
    if age_s > max_age_s:
        return f"engine {engine} heartbeat is {age_s:.1f} s old (limit {max_age_s:.1f} s)"
    return None
