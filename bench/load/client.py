"""The load benchmark's client, run in its own process: ``python -m bench.load.client`` reads one phase as
JSON on stdin and prints its result as JSON on stdout.

Three kinds of phase, each through the gRPC door (the SDK) or the OpenAI HTTP door (aiohttp, SSE streaming):

- ``closed``: ``concurrency`` callers each send one-stage requests back to back for ``duration_s``;
- ``streams``: ``streams`` requests opened at once (ramped over ``ramp_s``), each held until its last token;
  it reports how many were open at the same time;
- ``open``: Poisson arrivals at ``rate`` per second for ``duration_s``, whatever the answers (overload).

Every request is a one-stage workflow with a fresh program id. Outcomes are counted by status (``ok``, or
the gRPC status name / HTTP status the request failed with).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import grpc

from chimera_client import NO_RETRY, AsyncClient, ChimeraError, Completion, RetryPolicy, Sampling

PROMPT = "Write a function that returns the n-th Fibonacci number."


@dataclass(frozen=True, slots=True)
class Phase:
    kind: str  # closed | streams | open
    door: str  # grpc | http
    grpc_addr: str
    http_addr: str
    max_tokens: int = 16
    concurrency: int = 1
    duration_s: float = 10.0
    streams: int = 0
    ramp_s: float = 5.0
    rate: float = 0.0
    seed: int = 0
    timeout_s: float = 600.0
    # "none": the door's own answers are counted; "default": the SDK's default RetryPolicy, as a user gets
    # it (refusals retried after their Retry-After), to see what a caller sees in the end.
    # NOTE(overload-cancelled): under 10x overload with "default", 12-19% of calls used to end CANCELLED
    # "CANCELLED": gRPC core at the dispatcher dropping calls its asyncio server had not picked up yet,
    # once more than 1,000 waited (refused clients coming back together). The dispatcher now lets that
    # backlog grow to its door limit (services.dispatcher.server.grpc_server_options).
    retry: str = "none"


@dataclass
class Outcome:
    status: str = "ok"
    dispatch_ms: float = 0.0
    queue_wait_s: float = 0.0
    e2e_s: float = 0.0
    retry_after: str | None = None  # on a refusal: the Retry-After the server sent
    browned_out: bool = False
    detail: str = ""  # what a failure said
    ended: float = 0.0  # perf_counter when it ended: failures at one instant point at one event


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)
    open_now: int = 0
    open_max: int = 0


Send = Callable[[Tally], Awaitable[Outcome]]


def grpc_sender(client: AsyncClient, p: Phase) -> Send:
    sampling = Sampling(max_tokens=p.max_tokens, temperature=0.0)

    async def send(t: Tally) -> Outcome:
        t0, opened = time.perf_counter(), False
        try:
            async for ev in client.stream(
                PROMPT, program_id=f"load-{uuid.uuid4().hex}", stage=0, workflow="load", sampling=sampling
            ):
                if not opened:
                    opened = _opened(t)
                if isinstance(ev, Completion):
                    return Outcome(
                        dispatch_ms=ev.dispatch_ms,
                        queue_wait_s=ev.queue_wait_s,
                        e2e_s=time.perf_counter() - t0,
                        browned_out=bool(ev.browned_out_from),
                    )
            return Outcome("NO_FINAL")
        except ChimeraError as e:
            retry = None if e.retry_after_s is None else f"{e.retry_after_s:g}"
            # The SDK raises its own error from the gRPC one; gRPC's debug string says which side ended
            # the call (a local cancel, a closed channel, an RST_STREAM from the server).
            rpc = e.__context__
            debug = rpc.debug_error_string() if isinstance(rpc, grpc.aio.AioRpcError) else ""
            now = time.perf_counter()
            detail = f"{e.details[:200]} after {now - t0:.1f} s; {debug[:300]}"
            return Outcome(e.code, retry_after=retry, e2e_s=now - t0, detail=detail, ended=now)
        finally:
            if opened:
                t.open_now -= 1

    return send


def http_sender(session: aiohttp.ClientSession, p: Phase) -> Send:
    body = {
        "model": "auto",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": p.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }

    async def send(t: Tally) -> Outcome:
        t0, opened = time.perf_counter(), False
        try:
            async with session.post("/v1/chat/completions", json=body) as r:
                if r.status != 200:
                    said = (await r.read()).decode(errors="replace")[:200]
                    now = time.perf_counter()
                    retry = r.headers.get("retry-after")
                    return Outcome(f"HTTP {r.status}", retry_after=retry, detail=said, ended=now)
                out = Outcome("NO_FINAL", browned_out="x-chimera-brownout-from" in r.headers)
                async for raw in r.content:
                    line = raw.decode().rstrip("\r\n")
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    if not opened:
                        opened = _opened(t)
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        out.status = f"SSE {chunk['error'].get('code')}"
                        out.detail = str(chunk["error"].get("message", ""))[:200]
                        out.ended = time.perf_counter()
                    elif info := chunk.get("chimera"):
                        out.status, out.dispatch_ms = "ok", float(info["dispatch_ms"])
                        out.queue_wait_s = float(info["queue_wait_s"])
                out.e2e_s = time.perf_counter() - t0
                return out
        except (aiohttp.ClientError, TimeoutError) as e:
            detail = f"{e!r} after {time.perf_counter() - t0:.2f} s"
            return Outcome(f"transport {type(e).__name__}", detail=detail)
        finally:
            if opened:
                t.open_now -= 1

    return send


def _opened(t: Tally) -> bool:
    t.open_now += 1
    t.open_max = max(t.open_max, t.open_now)
    return True


async def closed(send: Send, t: Tally, p: Phase) -> None:
    stop = time.perf_counter() + p.duration_s

    async def caller() -> None:
        while time.perf_counter() < stop:
            t.outcomes.append(await send(t))

    await asyncio.gather(*(caller() for _ in range(p.concurrency)))


async def streams(send: Send, t: Tally, p: Phase) -> None:
    async def one(delay: float) -> None:
        await asyncio.sleep(delay)
        t.outcomes.append(await send(t))

    await asyncio.gather(*(one(p.ramp_s * i / max(1, p.streams)) for i in range(p.streams)))


async def open_loop(send: Send, t: Tally, p: Phase) -> None:
    rng, tasks = random.Random(p.seed), []
    stop = time.perf_counter() + p.duration_s

    async def one() -> None:
        t.outcomes.append(await send(t))

    while time.perf_counter() < stop:
        tasks.append(asyncio.create_task(one()))
        await asyncio.sleep(rng.expovariate(p.rate))
    await asyncio.gather(*tasks)


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _failure_times(t: Tally, t0: float) -> dict[str, dict[str, float]]:
    """Per failure status: how long its calls lasted and when (from the phase's start) they ended."""
    out = {}
    for status in sorted({o.status for o in t.outcomes if o.ended}):
        xs = [o for o in t.outcomes if o.status == status and o.ended]
        lasted, ended = [o.e2e_s for o in xs], [o.ended - t0 for o in xs]
        out[status] = {
            "lasted_s_min": round(min(lasted), 2),
            "lasted_s_p50": round(percentile(lasted, 0.5), 2),
            "lasted_s_max": round(max(lasted), 2),
            "ended_s_min": round(min(ended), 2),
            "ended_s_max": round(max(ended), 2),
        }
    return out


def summary(t: Tally, elapsed_s: float) -> dict[str, Any]:
    ok = [o for o in t.outcomes if o.status == "ok"]
    refused = [o for o in t.outcomes if o.status in ("RESOURCE_EXHAUSTED", "HTTP 429")]
    return {
        "requests": len(t.outcomes),
        "elapsed_s": elapsed_s,
        "stages_per_s": len(ok) / elapsed_s if elapsed_s else 0.0,
        "by_status": dict(Counter(o.status for o in t.outcomes)),
        "ok": len(ok),
        "refused": len(refused),
        "refused_with_retry_after": sum(o.retry_after is not None for o in refused),
        "browned_out": sum(o.browned_out for o in ok),
        "errors_other": len(t.outcomes) - len(ok) - len(refused),
        "open_max": t.open_max,
        "failure_samples": sorted({f"{o.status}: {o.detail}" for o in t.outcomes if o.status != "ok"})[:10],
        "dispatch_ms_p50": percentile([o.dispatch_ms for o in ok], 0.5),
        "dispatch_ms_p99": percentile([o.dispatch_ms for o in ok], 0.99),
        "queue_wait_s_p50": percentile([o.queue_wait_s for o in ok], 0.5),
        "queue_wait_s_p99": percentile([o.queue_wait_s for o in ok], 0.99),
        "e2e_s_p50": percentile([o.e2e_s for o in ok], 0.5),
        "e2e_s_p99": percentile([o.e2e_s for o in ok], 0.99),
    }


async def run(p: Phase) -> dict[str, Any]:
    kind = {"closed": closed, "streams": streams, "open": open_loop}[p.kind]
    t = Tally()
    # aiohttp, not httpx: httpx's connection pool costs the client most of a core at 64 requests in
    # flight, where the door itself still has room (the client, not the door, was what saturated).
    conns = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=p.timeout_s)
    retry = {"none": NO_RETRY, "default": RetryPolicy()}[p.retry]
    async with (
        # No SDK retries unless asked (Phase.retry): the benchmark counts the door's own answers (a retried
        # refusal would be hidden and its wait counted as latency), as the HTTP client here does not retry.
        AsyncClient(p.grpc_addr, default_timeout_s=p.timeout_s, retry=retry) as grpc_client,
        aiohttp.ClientSession(f"http://{p.http_addr}", connector=conns, timeout=timeout) as http,
    ):
        send = grpc_sender(grpc_client, p) if p.door == "grpc" else http_sender(http, p)
        t0 = time.perf_counter()
        await kind(send, t, p)
        elapsed = time.perf_counter() - t0
    return {"phase": asdict(p), **summary(t, elapsed), "failure_times": _failure_times(t, t0)}


def main() -> None:
    phase = Phase(**json.loads(sys.stdin.read()))
    json.dump(asyncio.run(run(phase)), sys.stdout)


if __name__ == "__main__":
    main()
