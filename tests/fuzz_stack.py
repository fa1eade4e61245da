"""What the two door fuzzers (``test_fuzz_http``, ``test_fuzz_grpc``) share: a stack to fuzz, a tally of
what came back, and the residue check.

The stack is the real dispatcher (gRPC and HTTP doors, one Dispatcher, its reaper) on the test's private
Redis and key prefix, with the fake router and predictor of ``dispatcher_fakes`` and a real worker per engine
driving a simulated engine, all in the test's event loop. The fuzzer itself runs in a thread with blocking
clients (hypothesis drives a plain function), so the loop stays free to serve it.

Residue: a request the door refuses must leave Redis as it found it. Cases run one at a time; after an
accepted one the fuzzer waits until every engine's queue and claims are empty, so that nothing still moving
is mistaken for a refused request's write. Before each case it snapshots the request state under the
test's prefix (program rows, request records, output streams, queues, claims) and, after a refusal, any key
added or changed is residue.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import redis
from dispatcher_fakes import dispatcher_server, fake_dependencies
from redis.asyncio import Redis

from services.common.keys import Keys
from services.common.queue import QueueStore
from services.common.redis_proc import PrivateRedis
from services.dispatcher.http_api import build_http_server
from services.worker.engine.simulated import SimulatedEngine
from services.worker.engine.simulated_inputs import measured_style_profile
from services.worker.worker import Worker, WorkerOptions

# Engine ids and models: the models the fake router scores (dispatcher_fakes.CONFIDENCE).
ENGINES = {"e0": "m-small", "e1": "m-big"}
# Valid cases may ask for up to this many tokens (the stack's max_tokens_limit, which /openapi.json states,
# so the schema's valid cases stay within it). The simulated engine emits one token per step of its
# profile (33 ms at batch 1, 100 times faster here): 32 tokens take ~11 ms instead of the default limit's
# 8,192 taking ~3 s, which keeps a few hundred accepted cases within the suite's time.
MAX_TOKENS = 32
TIME_SCALE = 100.0
# One call is a hang past this: a dispatched request here finishes in well under a second.
HANG_S = 10.0
# After an accepted case, how long the engines get to drain before it counts as a hang.
DRAIN_S = 10.0
_STATE_PARTS = (":prog:", ":req:", ":out:")
_STATE_SUFFIXES = (":queue", ":claims")
_EXAMPLES_SHOWN = 5


@dataclass
class FuzzStack:
    http_url: str  # http://host:port
    grpc_addr: str
    redis_url: str
    keys: Keys


@contextlib.asynccontextmanager
async def fuzz_stack(private_redis: PrivateRedis, keys: Keys, r: Redis) -> AsyncIterator[FuzzStack]:
    async with fake_dependencies(private_redis, keys) as fakes:
        settings = fakes.model_copy(
            update={"host": "127.0.0.1", "max_tokens_default": 16, "max_tokens_limit": MAX_TOKENS}
        )
        async with _workers(r, keys), dispatcher_server(settings, r, keys) as grpc_server:
            http = build_http_server(grpc_server.dispatcher)
            port = await http.start()
            try:
                yield FuzzStack(
                    f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_server.port}", private_redis.url, keys
                )
            finally:
                await http.stop()


@contextlib.asynccontextmanager
async def _workers(r: Redis, keys: Keys) -> AsyncIterator[None]:
    workers = [
        Worker(
            QueueStore(r, keys),
            r,
            SimulatedEngine(model, measured_style_profile(4), time_scale=TIME_SCALE),
            WorkerOptions(
                engine_id=eid, kind="simulated", worker_id=f"fuzz-{eid}", claim_wait_s=0.05, grace_s=2
            ),
        )
        for eid, model in ENGINES.items()
    ]
    tasks = [asyncio.create_task(w.run(), name=f"worker-{i}") for i, w in enumerate(workers)]
    try:
        while await r.scard(keys.engines()) < len(workers):  # registered: the dispatcher can route
            await asyncio.sleep(0.02)
        yield
    finally:
        for w in workers:
            w.request_stop()
        await asyncio.gather(*tasks)


State = dict[str, object]


class Observer:
    """Blocking Redis reads for the fuzzer's thread: request-state snapshots and the wait for idle engines."""

    def __init__(self, stack: FuzzStack) -> None:
        self._r = redis.Redis.from_url(stack.redis_url, decode_responses=True)
        self._keys = stack.keys

    def close(self) -> None:
        self._r.close()

    def snapshot(self) -> State:
        names = [
            k
            for k in self._r.scan_iter(match=f"{self._keys.prefix}:*", count=1000)
            if any(p in k for p in _STATE_PARTS) or k.endswith(_STATE_SUFFIXES)
        ]
        pipe = self._r.pipeline(transaction=False)
        for k in names:
            pipe.type(k)
        types = pipe.execute()
        for k, t in zip(names, types, strict=True):
            if t == "hash":
                pipe.hgetall(k)
            elif t == "zset":
                pipe.zrange(k, 0, -1)
            elif t == "stream":
                pipe.xlen(k)
            else:
                pipe.type(k)
        return dict(zip(names, pipe.execute(), strict=True))

    def wait_idle(self, timeout_s: float = DRAIN_S) -> bool:
        """True once no engine has anything queued or claimed (within ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            pipe = self._r.pipeline(transaction=False)
            for eid in ENGINES:
                pipe.zcard(self._keys.queue(eid))
                pipe.zcard(self._keys.claims(eid))
            if not any(pipe.execute()):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)


def residue(before: State, after: State) -> list[str]:
    """Keys a refused request added or changed (a key that expired or was removed meanwhile is not one)."""
    return sorted(k for k, v in after.items() if before.get(k) != v)


@dataclass
class Tally:
    """What one fuzz run saw. Server errors are "documented" when the door's contract lists them (503 and
    504 on HTTP, UNAVAILABLE and DEADLINE_EXCEEDED on gRPC); any other is a bug."""

    door: str
    statuses: Counter[str] = field(default_factory=Counter)
    cases: int = 0
    ok: int = 0
    client_errors: int = 0
    documented_5xx: int = 0
    undocumented_5xx: list[str] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    residue: list[str] = field(default_factory=list)
    # Accepted cases whose writes the snapshots saw: the residue check is not blind.
    writes_seen: int = 0

    def count(self, http_status: int, label: str | None = None) -> None:
        self.cases += 1
        self.statuses[label or str(http_status)] += 1
        if http_status < 300:
            self.ok += 1
        elif http_status < 500:
            self.client_errors += 1

    def line(self) -> str:
        seen = " ".join(f"{s}:{n}" for s, n in sorted(self.statuses.items()))
        return (
            f"{self.door} fuzz: {self.cases} cases, {self.ok} 2xx, {self.client_errors} 4xx, "
            f"{self.documented_5xx} documented 5xx, {len(self.undocumented_5xx)} undocumented 5xx, "
            f"{len(self.hangs)} hangs, {len(self.residue)} residue ({seen})"
        )

    def failures(self) -> str:
        parts = []
        for name, found in (
            ("undocumented 5xx", self.undocumented_5xx),
            ("hangs", self.hangs),
            ("residue", self.residue),
        ):
            parts += [f"{name}: {x}" for x in found[:_EXAMPLES_SHOWN]]
        return "\n".join([self.line(), *parts])

    def check(self, min_ok: int) -> None:
        """Zero undocumented 5xx, hangs and residue; and enough accepted cases that dispatch was exercised."""
        assert not (self.undocumented_5xx or self.hangs or self.residue), self.failures()
        assert self.ok >= min_ok, f"only {self.ok} cases were accepted: {self.line()}"
        assert self.writes_seen, f"no accepted case's writes were seen in the snapshots: {self.line()}"
