"""The GPU-rates benchmark's client, run in its own process: ``python -m bench.overhead.gpu_rates_client``
reads one phase as JSON on stdin and prints its result as JSON on stdout.

``concurrency`` callers send one-stage requests back to back through the gRPC door for ``duration_s`` (or,
with ``rate``, Poisson arrivals at that rate). Each request's length is drawn from ``lengths`` (the real
traces' output tokens) and is exactly that long (the simulated engine runs to ``max_tokens``); a share
``stream_share`` of them are streamed (``AsyncClient.stream``), the rest read whole (``generate``, which asks
for the final event only). Streamed requests record their time to first text and the gaps between the
pieces of text they received.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.load.client import percentile
from chimera_client import NO_RETRY, AsyncClient, Completion, Sampling

PROMPT = "Write a function that returns the n-th Fibonacci number."


@dataclass(frozen=True, slots=True)
class Phase:
    addr: str
    lengths: tuple[int, ...]
    concurrency: int = 256
    duration_s: float = 30.0
    stream_share: float = 1.0
    rate: float = 0.0  # > 0: open-loop arrivals per second instead of closed-loop callers
    seed: int = 0
    timeout_s: float = 600.0


@dataclass
class Tally:
    stages: int = 0
    streamed: int = 0
    tokens: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    ttft_s: list[float] = field(default_factory=list)
    gaps_s: list[float] = field(default_factory=list)
    chunks: int = 0


async def one(client: AsyncClient, p: Phase, rng: random.Random, t: Tally) -> None:
    length = rng.choice(p.lengths)
    streamed = rng.random() < p.stream_share
    kw: dict[str, Any] = {
        "program_id": f"gpu-{uuid.uuid4().hex}",
        "stage": 0,
        "workflow": "code/coder",
        "sampling": Sampling(max_tokens=length, temperature=0.0),
    }
    try:
        if not streamed:
            done = await client.generate(PROMPT, **kw)
        else:
            t0 = time.perf_counter()
            last, done_ev = 0.0, None
            async for ev in client.stream(PROMPT, **kw):
                now = time.perf_counter()
                if isinstance(ev, Completion):
                    done_ev = ev
                    continue
                if not last:
                    t.ttft_s.append(now - t0)
                else:
                    t.gaps_s.append(now - last)
                last = now
                t.chunks += 1
            assert done_ev is not None
            done = done_ev
            t.streamed += 1
    except Exception as e:  # counted, not raised: the phase reports its errors
        name = type(e).__name__
        t.errors[name] = t.errors.get(name, 0) + 1
        return
    t.stages += 1
    t.tokens += done.completion_tokens


async def run(p: Phase) -> dict[str, Any]:
    t, rng = Tally(), random.Random(p.seed)
    async with AsyncClient(p.addr, default_timeout_s=p.timeout_s, retry=NO_RETRY) as client:
        t0 = time.perf_counter()
        stop = t0 + p.duration_s
        if p.rate > 0:
            tasks = []
            while time.perf_counter() < stop:
                tasks.append(asyncio.create_task(one(client, p, rng, t)))
                await asyncio.sleep(rng.expovariate(p.rate))
            await asyncio.gather(*tasks)
        else:

            async def caller() -> None:
                while time.perf_counter() < stop:
                    await one(client, p, rng, t)

            await asyncio.gather(*(caller() for _ in range(p.concurrency)))
        elapsed = time.perf_counter() - t0
    return {
        "phase": {k: v for k, v in asdict(p).items() if k != "lengths"},
        "elapsed_s": round(elapsed, 3),
        "stages": t.stages,
        "streamed": t.streamed,
        "tokens": t.tokens,
        "errors": t.errors,
        "tokens_per_s": round(t.tokens / elapsed, 1),
        "stages_per_s": round(t.stages / elapsed, 2),
        "chunks": t.chunks,
        "ttft_ms_p50": round(1000 * percentile(t.ttft_s, 0.5), 1),
        "ttft_ms_p99": round(1000 * percentile(t.ttft_s, 0.99), 1),
        "chunk_gap_ms_p10": round(1000 * percentile(t.gaps_s, 0.1), 1),
        "chunk_gap_ms_p50": round(1000 * percentile(t.gaps_s, 0.5), 1),
        "chunk_gap_ms_p90": round(1000 * percentile(t.gaps_s, 0.9), 1),
        "chunk_gap_ms_p99": round(1000 * percentile(t.gaps_s, 0.99), 1),
    }


def main() -> None:
    raw = json.loads(sys.stdin.read())
    raw["lengths"] = tuple(raw["lengths"])
    json.dump(asyncio.run(run(Phase(**raw))), sys.stdout)


if __name__ == "__main__":
    main()
