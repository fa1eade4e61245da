"""Three dispatcher replicas on one Redis, as real processes: the launcher's stack (private redis-server,
router, predictor, two simulated-engine workers, a dispatcher) plus two
more ``python -m services.dispatcher``.
A workflow's stages alternate between the replicas and still run in order on one engine; the SDK spreads
calls over all three; one replica at a time runs the reaper, and another takes over when it stops."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import redis
from dispatcher_fakes import simulated_stack
from service_proc import Service, dispatcher_env

from services.common.keys import Keys
from services.launcher.stack import Stack
from services.sdk.client import AsyncClient
from services.sdk.retry import NO_RETRY
from services.sdk.types import Sampling

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

_SERVING = re.compile(r"serving on \S+:(\d+) ")


def _replica(stack: Stack, name: str) -> tuple[Service, str]:
    env = dispatcher_env(
        stack.redis_url,
        stack.key_prefix,
        router_addr=stack.router_addr,
        predictor_addr=stack.predictor_addr,
        replica=name,
        reaper_interval_s="0.5",
        grace_s="1",
    )
    svc = Service("services.dispatcher", env)
    return svc, f"127.0.0.1:{svc.wait_for(_SERVING).group(1)}"


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, list[Service], list[str]]]:
    with simulated_stack(tmp_path_factory.mktemp("replicas")) as stack:
        started: list[Service] = []
        try:
            addrs = [stack.dispatcher_addr]
            for name in ("r2", "r3"):
                svc, addr = _replica(stack, name)
                started.append(svc)
                addrs.append(addr)
            yield stack, started, addrs
        finally:
            for svc in started:
                if svc.proc.poll() is None:
                    svc.stop()


async def test_stages_alternating_between_replicas_keep_their_order_and_engine(
    replicas: tuple[Stack, list[Service], list[str]],
) -> None:
    _, _, addrs = replicas
    clients = [AsyncClient(a, retry=NO_RETRY) for a in addrs]
    try:

        async def workflow(i: int) -> list[tuple[int, str]]:
            seen = []
            for stage in range(4):
                client = clients[(i + stage) % len(clients)]  # each stage through the next replica
                done = await client.generate(
                    f"task {i} step {stage}",
                    program_id=f"rep-{i}",
                    stage=stage,
                    workflow="wf",
                    sampling=Sampling(max_tokens=16),
                )
                seen.append((stage, done.engine))
            assert (await clients[i % len(clients)].end_program(f"rep-{i}")).found
            return seen

        runs = await asyncio.gather(*(workflow(i) for i in range(9)))
    finally:
        for c in clients:
            await c.close()
    for run in runs:
        assert [s for s, _ in run] == [0, 1, 2, 3]
        assert len({e for _, e in run}) == 1, run  # one engine per workflow, whichever replica took a stage


async def test_the_sdk_spreads_calls_over_every_replica(
    replicas: tuple[Stack, list[Service], list[str]],
) -> None:
    stack, _, addrs = replicas
    r = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    keys = Keys(stack.key_prefix)
    async with AsyncClient(addrs, retry=NO_RETRY) as client:
        answers = [
            await client.generate(
                f"one-shot {i}",
                program_id=f"rr-{i}",
                stage=0,
                workflow="wf",
                sampling=Sampling(max_tokens=4),
            )
            for i in range(12)
        ]
        for i in range(12):
            await client.end_program(f"rr-{i}")
    assert all(a.text for a in answers)
    # The replica that dispatched a request is in its decision record (`chimera explain`).
    served = Counter(
        json.loads(r.hget(keys.request(a.engine, a.request_id), "decision") or "{}").get("replica")
        for a in answers
    )
    r.close()
    assert len(served) == 3 and None not in served, served


def test_one_replica_at_a_time_runs_the_reaper(replicas: tuple[Stack, list[Service], list[str]]) -> None:
    stack, started, _ = replicas
    r = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    lease = Keys(stack.key_prefix).reaper_lease()
    holder = r.get(lease)
    assert holder is not None
    runs = [s for s in started if any("runs the reaper" in line for line in s.lines)]
    # The launcher's replica started first and took the lease; r2 and r3 never ran the reaper meanwhile.
    assert holder not in ("r2", "r3") and runs == [], holder
    # The holder stops (SIGTERM: it hands the lease back); another replica takes it at its next round. The
    # supervisor restarts the stopped one under a new name (host:pid), which may win the lease too.
    first = next(c for c in stack.supervisor.children if c.name == "dispatcher")
    first.signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and r.get(lease) in (None, holder):
        time.sleep(0.2)
    now = r.get(lease)
    r.close()
    assert now not in (None, holder), now
