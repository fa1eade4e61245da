"""The simulator's bookkeeping and the real dispatcher on Redis make the same decisions on one trace.

The simulator schedules through ``services.policy.ledger.Ledger``; the dispatcher through its Lua scripts in
Redis. Both call the same policy functions, but each keeps its own state: in-flight accounting, affinity,
queue order, attained service. One seeded trace of arrivals, claims and completions is driven through both
in lockstep, and after every step the engine chosen, the branch, the queue score, every engine's queue (in
serving order) and every engine's load must be the same. Each side takes its knobs from its own defaults
(``SimConfig`` and ``DispatcherSettings``), which must agree.

The router and predictor are in-process fakes answering the trace's numbers; claims and completions go
through the real ``QueueStore`` as a worker's would.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest
from redis.asyncio import Redis

from bench.sweep.sim import SimConfig
from services.common.keys import EngineField, Keys
from services.common.queue import QueueStore
from services.common.types import (
    ChatMessage,
    ClaimedRequest,
    EngineProfile,
    Prediction,
    SamplingParams,
    StageRequest,
    StageResult,
)
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.dispatch import Dispatcher
from services.policy.contract import JobSize
from services.policy.ledger import Ledger
from services.policy.registry import POLICIES

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

ENGINES: dict[str, tuple[str, EngineProfile]] = {
    "e0": ("m-small", EngineProfile(5.0, 4, 0.05, ((1, 5.0), (4, 7.0)))),
    "e1": ("m-mid", EngineProfile(10.0, 4, 0.1, ((1, 10.0), (4, 15.0)))),
    "e2": ("m-big", EngineProfile(20.0, 2, 0.2, ((1, 20.0), (2, 26.0)))),
}
MODELS = sorted({m for m, _ in ENGINES.values()})
N_WORKFLOWS = 40
SLOTS = 2  # requests each engine runs at once in the trace


@dataclass(frozen=True, slots=True)
class Workflow:
    program_id: str
    q: Mapping[str, float]  # router confidence per model
    outputs: tuple[int, ...]  # output tokens per stage
    y: Mapping[str, tuple[int, ...]]  # predicted remaining tokens per model, per stage
    pin: str | None


def workflows(rng: random.Random) -> list[Workflow]:
    out = []
    for i in range(N_WORKFLOWS):
        n = rng.choice((1, 2, 4))
        outputs = tuple(rng.randint(20, 400) for _ in range(n))
        # Predictions near the truth (what a fair predictor gives), different per model.
        y = {
            m: tuple(max(1, int(sum(outputs[k:]) * rng.uniform(0.6, 1.4))) for k in range(n)) for m in MODELS
        }
        q = {
            "m-small": rng.uniform(0.1, 0.5),
            "m-mid": rng.uniform(0.3, 0.7),
            "m-big": rng.uniform(0.5, 0.95),
        }
        pin = rng.choice(MODELS) if i % 8 == 5 else None
        out.append(Workflow(f"p{i:03d}", q, outputs, y, pin))
    return out


class TraceRouter:
    def __init__(self, by_text: Mapping[str, Workflow]) -> None:
        self._by_text = by_text

    async def score(self, text: str, workflow: str, models: Sequence[str]) -> Mapping[str, float]:
        return {m: self._by_text[text].q[m] for m in models}


class TracePredictor:
    def __init__(self, by_program: Mapping[str, Workflow]) -> None:
        self._by_program = by_program

    async def predict(self, request: StageRequest, models: Sequence[str]) -> Mapping[str, Prediction]:
        ys = self._by_program[request.program_id].y
        return {m: Prediction(p50=ys[m][request.stage], p90=2 * ys[m][request.stage]) for m in models}


def _text(w: Workflow) -> str:
    return f"the task of {w.program_id}"


@dataclass
class Lockstep:
    """Both sides, and what the trace has done so far."""

    dispatcher: Dispatcher
    store: QueueStore
    redis: Redis
    keys: Keys
    ledger: Ledger
    policy: str
    now: list[float]
    running: dict[str, tuple[Workflow, int, ClaimedRequest]] = field(default_factory=dict)
    attained: dict[str, int] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)
    longest_queue: int = 0
    engines_used: set[str] = field(default_factory=set)

    async def dispatch(self, w: Workflow, stage: int) -> None:
        rid = f"{w.program_id}-{stage}"
        self.steps.append(f"dispatch {rid}")
        req = StageRequest(
            rid,
            w.program_id,
            stage,
            "code/planner-coder",
            (ChatMessage("user", _text(w)),),
            SamplingParams(max_tokens=w.outputs[stage]),
            model_pin=w.pin,
        )
        live = await self.dispatcher.dispatch(req)
        sim = self.ledger.dispatch(
            POLICIES[self.policy],
            SimConfig(tuple(ENGINES), 1.0, self.policy).knobs(),
            w.program_id,
            rid,
            stage,
            lambda model: JobSize(
                predicted_total=w.y[model][stage], attained=self.attained.get(w.program_id, 0)
            ),
            w.q if stage == 0 and w.pin is None else {},
            self.now[0],
            model_pin=w.pin,
        )
        where = " / ".join(self.steps[-3:])
        assert (live.engine, live.model, live.branch) == (
            sim.route.engine_id,
            sim.route.model,
            sim.route.branch,
        ), where
        assert live.score == sim.score, where
        self.engines_used.add(live.engine)

    async def claim(self, engine: str) -> None:
        self.steps.append(f"claim {engine}")
        (claimed,) = await self.store.claim(engine, "trace-worker", 1, lease_s=3600)
        rid = self.ledger.claim(engine)
        assert claimed.request.request_id == rid, self.steps[-3:]
        pid, stage = rid.rsplit("-", 1)
        self.running[rid] = (self.workflow[pid], int(stage), claimed)

    async def complete(self, rid: str) -> None:
        self.steps.append(f"complete {rid}")
        w, stage, claimed = self.running.pop(rid)
        tokens = w.outputs[stage]
        assert await self.store.complete(claimed, StageResult("text", "stop", 10, tokens), None)
        self.ledger.complete(claimed.engine, rid)
        # The store credited the program's attained service as it completed the stage (MLFQ reads it).
        self.attained[w.program_id] = self.attained.get(w.program_id, 0) + tokens
        if stage + 1 < len(w.outputs):
            await self.dispatch(w, stage + 1)
        else:
            await self.dispatcher.end_program(w.program_id, None)
            self.ledger.end_program(w.program_id)

    async def compare_state(self) -> None:
        for engine in ENGINES:
            live = await self.redis.zrange(self.keys.queue(engine), 0, -1)
            assert live == self.ledger.queue_order(engine), (engine, self.steps[-3:])
            load = int(await self.redis.hget(self.keys.engine_info(engine), EngineField.LOAD) or 0)
            assert load == self.ledger.load(engine), (engine, self.steps[-3:])
            self.longest_queue = max(self.longest_queue, len(live))

    workflow: dict[str, Workflow] = field(default_factory=dict)


async def _register(redis: Redis, keys: Keys, now: float) -> None:
    f = EngineField
    for eid, (model, profile) in ENGINES.items():
        await redis.sadd(keys.engines(), eid)
        await redis.hset(
            keys.engine_info(eid),
            mapping={
                f.MODEL: model,
                f.DECODE_MS_PER_TOKEN: repr(profile.decode_ms_per_token),
                f.MAX_BATCH_SIZE: str(profile.max_batch_size),
                f.MAX_NUM_SEQS: str(profile.max_batch_size),
                f.PROFILE: profile.to_json(),
                f.HEARTBEAT_MS: str(int(now * 1000)),
            },
        )


def test_the_simulators_defaults_are_the_dispatchers() -> None:
    assert SimConfig(tuple(ENGINES), 1.0, "chimera").knobs() == DispatcherSettings().knobs()


@pytest.mark.parametrize("policy", ["chimera", "chimera-plus", "vllm", "mlfq", "ltr"])
async def test_one_trace_gives_the_same_decisions_and_queues(
    policy: str, redis_client: Redis, keys: Keys
) -> None:
    rng = random.Random(20260323)
    trace = workflows(rng)
    now = [time.time()]
    await _register(redis_client, keys, now[0])
    settings = DispatcherSettings(policy=policy, engine_dead_after_s=3600)
    store = QueueStore(redis_client, keys)
    dispatcher = Dispatcher(
        store,
        redis_client,
        TraceRouter({_text(w): w for w in trace}),
        TracePredictor({w.program_id: w for w in trace}),
        settings,
        clock=lambda: now[0],
    )
    ledger = Ledger([(eid, model, profile) for eid, (model, profile) in ENGINES.items()])
    step = Lockstep(dispatcher, store, redis_client, keys, ledger, policy, now)
    step.workflow = {w.program_id: w for w in trace}
    arrivals = list(reversed(trace))
    while arrivals or step.running or any(ledger.head(e) for e in ENGINES):
        now[0] += rng.uniform(0.001, 0.05)
        claimable = [
            e
            for e in ENGINES
            if ledger.head(e) is not None and sum(c.engine == e for *_, c in step.running.values()) < SLOTS
        ]
        action = rng.random()
        if arrivals and (action < 0.45 or not (claimable or step.running)):
            await step.dispatch(arrivals.pop(), 0)
        elif claimable and (action < 0.7 or not step.running):
            await step.claim(rng.choice(claimable))
        else:
            await step.complete(rng.choice(sorted(step.running)))
        await step.compare_state()
    # The trace exercised what it claims to compare: queues with an order to get right, several engines.
    assert step.longest_queue >= 3 and len(step.engines_used) >= 2
    assert sum(s.startswith("dispatch") for s in step.steps) == sum(len(w.outputs) for w in trace)
