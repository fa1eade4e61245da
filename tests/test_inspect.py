"""``queue_view`` and ``explain`` against requests placed by the real Dispatcher.

The router and predictor are in-process fakes (``FakeConfidence`` answers ``CONFIDENCE``; ``FakeLength``
reads the prediction out of the task text, "len=N"), and the clock is a fake, so that aging can be set up
deterministically. The serving order is checked against the real ``QueueStore.claim`` a worker uses.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from dispatcher_fakes import CONFIDENCE, register_engines, simulated_stack
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from typer.testing import CliRunner

from services.common.keys import Keys
from services.common.queue import QueueStore
from services.common.redis_proc import PrivateRedis
from services.common.types import (
    ChatMessage,
    EngineProfile,
    EngineSnapshot,
    Prediction,
    SamplingParams,
    StageRequest,
)
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.dispatch import Dispatcher
from services.dispatcher.handoff import Dispatched
from services.inspect.cli import app
from services.inspect.explain import RequestNotFound, candidates_from_record, explain, recheck
from services.inspect.queue_view import QueueView, queue_view
from services.launcher.stack import Stack
from services.policy.chimera import select_engine
from services.policy.estimates import engine_load_ms
from services.sdk import AsyncClient, Completion, Sampling

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
AGING = 20.0


class FakeConfidence:
    async def score(self, text: str, workflow: str, models: Sequence[str]) -> Mapping[str, float]:
        if "fail-router" in text:
            raise RuntimeError("fake router is down")
        return {m: CONFIDENCE.get(m, 0.0) for m in models}


class FakeLength:
    async def predict(self, request: StageRequest, models: Sequence[str]) -> Mapping[str, Prediction]:
        m = re.search(r"len=(\d+)", request.user_text())
        y = int(m.group(1)) if m else 40
        return dict.fromkeys(models, Prediction(p50=y, p90=2 * y))


class FakeClock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def _tick(redis: Redis, keys: Keys, clock: FakeClock, to: float) -> None:
    """Move the fake clock; the engines heartbeat at the new time so they stay alive."""
    clock.now = to
    await register_engines(redis, keys, heartbeat_ms=int(to * 1000))


def _dispatcher(redis: Redis, keys: Keys, url: str, clock: FakeClock) -> Dispatcher:
    settings = DispatcherSettings(redis_url=url, key_prefix=keys.prefix, aging_rate=AGING)
    return Dispatcher(QueueStore(redis, keys), redis, FakeConfidence(), FakeLength(), settings, clock)


async def _dispatch(
    d: Dispatcher,
    rid: str,
    text: str,
    *,
    program: str | None = None,
    stage: int = 0,
    model: str | None = None,
) -> Dispatched:
    return await d.dispatch(
        StageRequest(
            request_id=rid,
            program_id=program or f"p-{rid}",
            stage=stage,
            workflow="code/coder",
            messages=(ChatMessage("user", text),),
            sampling=SamplingParams(max_tokens=64),
            model_pin=model,
        )
    )


async def test_queue_lists_requests_in_the_order_workers_claim_them(
    private_redis: PrivateRedis, keys: Keys, redis_client: Redis
) -> None:
    await register_engines(redis_client, keys)
    clock = FakeClock()
    d = _dispatcher(redis_client, keys, private_redis.url, clock)
    t0 = clock.now
    # Pinned to m-small (e0), spaced in time so that aging decides against the shorter, later requests.
    for rid, y, dt in (
        ("r-a", 1000, 0),
        ("r-c", 50, 1),
        ("r-b", 100, 100),
        ("r-d", 100, 100),
        ("r-e", 5000, 101),
    ):
        await _tick(redis_client, keys, clock, t0 + dt)
        await _dispatch(d, rid, f"task len={y}", model="m-small")
    for i in range(4):  # workflows the policy places itself: all on e1, since e0 is loaded
        await _tick(redis_client, keys, clock, t0 + 102 + i)
        await _dispatch(d, f"r-auto{i}", f"auto task len={30 + 200 * i}")
    clock.now = t0 + 110
    view = await queue_view(redis_client, keys, now=clock.now)
    by_engine = {e.engine: e for e in view.engines}
    assert set(by_engine) == {"e0", "e1"} and by_engine["e0"].model == "m-small"
    pinned = [w.request_id for w in by_engine["e0"].waiting if not w.request_id.startswith("r-auto")]
    # r-a (1000 tokens, waited longest) is ahead of r-b (100 tokens, 100 s later); r-b/r-d tie on score.
    assert pinned == ["r-c", "r-a", "r-b", "r-d", "r-e"]
    assert [w.request_id for w in by_engine["e1"].waiting] == [f"r-auto{i}" for i in range(4)]
    for e in view.engines:
        assert [w.position for w in e.waiting] == list(range(e.waiting_total))
        prios = [w.effective_priority for w in e.waiting]
        assert prios == sorted(prios)
        for w in e.waiting:
            fields = await redis_client.hmget(keys.request(e.engine, w.request_id), ["y", "t_enq"])
            y, t_enq = int(fields[0] or 0), float(fields[1] or 0)
            assert w.predicted_tokens == y and w.age_s == pytest.approx(clock.now - t_enq)
            assert w.effective_priority == pytest.approx(y - AGING * (clock.now - t_enq), abs=1e-3)
    assert {p.program_id: p.engine for p in view.programs}["p-r-a"] == "e0"
    assert len(view.programs) == 9
    store = QueueStore(redis_client, keys)
    for e in view.engines:
        served = [
            c.request.request_id
            for _ in range(e.waiting_total)
            for c in await store.claim(e.engine, "w", 1, 30)
        ]
        assert served == [w.request_id for w in e.waiting]
    running = await queue_view(redis_client, keys, "e0", now=time.time())
    assert (
        running.engines[0].waiting == () and len(running.engines[0].running) == by_engine["e0"].waiting_total
    )
    assert all(25 < r.lease_left_s <= 30 and r.worker == "w" for r in running.engines[0].running)
    assert {p.engine for p in running.programs} == {"e0"}


async def test_explain_reproduces_the_dispatchers_decision(
    private_redis: PrivateRedis, keys: Keys, redis_client: Redis
) -> None:
    await register_engines(redis_client, keys)
    # L[e0] = 1600 * 5 / 16 = 500 ms (fastest); L[e1] = 300 * 20 / 8 = 750 ms = (1 + 0.5) * 500: on the bound.
    await redis_client.hset(keys.engine_info("e0"), "load", 1600)
    await redis_client.hset(keys.engine_info("e1"), "load", 300)
    d = _dispatcher(redis_client, keys, private_redis.url, FakeClock())
    seen = {e.engine_id: engine_load_ms(e) for e in await d.engines()}
    x = await _dispatch(d, "r-x", "plan len=40")
    assert x.engine == "e1"
    ex = await explain(redis_client, keys, "r-x")
    assert (ex.engine, ex.model, ex.branch, ex.state, ex.position, ex.ahead) == (
        "e1",
        "m-big",
        "new",
        "queued",
        0,
        (),
    )
    assert {c.engine: c.q for c in ex.candidates} == {"e0": CONFIDENCE["m-small"], "e1": CONFIDENCE["m-big"]}
    assert {c.engine: c.cost for c in ex.candidates} == pytest.approx(seen) and ex.loads_ms == pytest.approx(
        seen
    )
    assert ex.recheck is not None and ex.recheck.consistent and ex.recheck.engine == "e1"
    assert ex.recheck.slack_bound_ms == pytest.approx(750.0)
    assert any("left the least-loaded e0" in r for r in ex.reasons)
    # Now e1 is past the slack bound (340 tokens -> 850 ms): the next workflow stays on the fastest engine.
    seen = {e.engine_id: engine_load_ms(e) for e in await d.engines()}
    y = await _dispatch(d, "r-y", "other len=10")
    ey = await explain(redis_client, keys, "r-y")
    assert ey.engine == y.engine == "e0" and ey.loads_ms == pytest.approx(seen)
    e1 = next(c for c in ey.candidates if c.engine == "e1")
    assert (e1.slack_ok, e1.margin_ok, e1.chosen) == (False, True, False)
    assert (
        ey.recheck is not None and ey.recheck.consistent and any("no engine passed" in r for r in ey.reasons)
    )
    # Stage 1 of x's program follows it (affinity), and waits behind x (x has the smaller score).
    await _dispatch(d, "r-x2", "next len=900", program="p-r-x", stage=1)
    ex2 = await explain(redis_client, keys, "r-x2")
    assert (ex2.engine, ex2.branch, ex2.candidates, ex2.position) == ("e1", "reuse", (), 1)
    assert [w.request_id for w in ex2.ahead] == ["r-x"] and any("affinity" in r for r in ex2.reasons)
    await _dispatch(d, "r-z", "fail-router len=5")
    ez = await explain(redis_client, keys, "r-z")
    assert ez.degraded == ("router",) and any("router failed" in r for r in ez.reasons)
    with pytest.raises(RequestNotFound):
        await explain(redis_client, keys, "no-such-request")


def test_cli_queue_and_explain(
    private_redis: PrivateRedis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def setup() -> None:
        redis = Redis.from_url(private_redis.url, decode_responses=True)
        try:
            await register_engines(redis, keys)
            d = _dispatcher(redis, keys, private_redis.url, FakeClock())
            for rid, y in (("r-long", 700), ("r-short", 20)):
                await _dispatch(d, rid, f"t len={y}", model="m-small")
        finally:
            await redis.aclose()

    asyncio.run(setup())
    monkeypatch.setenv("CHIMERA_REDIS_URL", private_redis.url)
    monkeypatch.setenv("CHIMERA_KEY_PREFIX", keys.prefix)
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()
    out = runner.invoke(app, ["queue"])
    assert out.exit_code == 0, out.output
    assert out.output.index("r-short") < out.output.index("r-long") and "programs: 2" in out.output
    out = runner.invoke(app, ["queue", "e0", "--json"])
    view = json.loads(out.output)
    assert [w["request_id"] for w in view["engines"][0]["waiting"]] == ["r-short", "r-long"]
    out = runner.invoke(app, ["explain", "r-long"])
    assert out.exit_code == 0 and "pinned" in out.output and "r-short" in out.output  # r-short is ahead
    out = runner.invoke(app, ["explain", "nope"])
    assert out.exit_code == 1


TASKS = (
    ("code/coder", "Write a one-line function that adds two numbers."),
    (
        "math/solver",
        "Prove that there are infinitely many primes, then find all integer solutions of x^2 - 2y^2 = 1 "
        "with a detailed derivation of the recurrence, and compute the first ten of them.",
    ),
    (
        "code/coder",
        "Implement a complete JSON parser with error recovery, streaming input, unicode escapes, "
        "and a test suite covering every branch.",
    ),
    ("math/solver", "What is 2 + 2?"),
)


async def _load_and_snapshot(stack: Stack, n: int) -> tuple[QueueView, list[Completion]]:
    """Run ``n`` one-stage workflows at once; return the first queue view with a real queue in it."""
    redis = Redis.from_url(stack.redis_url, decode_responses=True)
    keys = Keys(stack.key_prefix)
    snapshot: QueueView | None = None
    try:
        async with AsyncClient(stack.dispatcher_addr, default_timeout_s=60) as client:

            async def one(i: int) -> Completion:
                async with client.workflow("code/coder", program_id=f"load-{i}") as wf:
                    return await wf.run_stage(
                        f"task {i}: write a parser for {i} formats", sampling=Sampling(64)
                    )

            tasks = [asyncio.create_task(one(i)) for i in range(n)]
            deadline = time.monotonic() + 30
            while snapshot is None and time.monotonic() < deadline and not all(t.done() for t in tasks):
                view = await queue_view(redis, keys)
                if any(e.waiting_total >= 3 for e in view.engines):
                    snapshot = view
                await asyncio.sleep(0.01)
            done = await asyncio.gather(*tasks)
    finally:
        await redis.aclose()
    assert snapshot is not None, "no engine ever had three requests waiting"
    return snapshot, list(done)


@pytest.mark.e2e
@pytest.mark.timeout(150)
def test_e2e_queue_view_order_is_the_order_workers_claim_and_explain_matches(tmp_path: Path) -> None:
    with simulated_stack(tmp_path, max_num_seqs=1) as stack:
        snapshot, done = asyncio.run(_load_and_snapshot(stack, 16))

        async def check() -> None:
            redis = Redis.from_url(stack.redis_url, decode_responses=True)
            keys = Keys(stack.key_prefix)
            try:
                for e in snapshot.engines:
                    claimed = [
                        float(
                            await redis.hget(keys.request(e.engine, w.request_id), "t_first_claim") or "nan"
                        )
                        for w in e.waiting
                    ]
                    # Later arrivals may cut in, but among what the view listed, workers claimed in its order.
                    assert all(t == t for t in claimed) and claimed == sorted(claimed), (e.engine, claimed)
                for c in done:
                    ex = await explain(redis, keys, c.request_id)
                    assert (ex.engine, ex.model, ex.state, ex.position) == (c.engine, c.model, "done", None)
                    assert ex.recheck is not None and ex.recheck.consistent and ex.recheck.engine == c.engine
                    assert ex.predicted_tokens == c.predicted_tokens
            finally:
                await redis.aclose()

        asyncio.run(check())
    assert sum(e.waiting_total for e in snapshot.engines) >= 3


_engine_st = st.tuples(
    st.sampled_from(["m-a", "m-b", "m-c"]),
    st.floats(1.0, 50.0),
    st.integers(1, 32),
    st.integers(0, 5000),
    st.booleans(),
)


@pytest.mark.unit
@settings(max_examples=300, deadline=None)
@given(
    engines=st.lists(_engine_st, min_size=1, max_size=5),
    conf=st.dictionaries(st.sampled_from(["m-a", "m-b", "m-c"]), st.floats(0.0, 1.0)),
    tau=st.sampled_from([0.0, 0.25, 0.5, 2.0, float("inf")]),
    delta_s=st.sampled_from([0.0, 0.05, 0.3]),
)
def test_recheck_reproduces_select_engine_from_its_record(
    engines: list[tuple[str, float, int, int, bool]], conf: dict[str, float], tau: float, delta_s: float
) -> None:
    snaps = [
        EngineSnapshot(f"e{i}", model, EngineProfile(ms, batch), load, alive=alive or i == 0)
        for i, (model, ms, batch, load, alive) in enumerate(engines)
    ]
    sel = select_engine(snaps, conf, tau, delta_s)
    # Through JSON, as the record is stored, and back through explain's reader.
    candidates = candidates_from_record(json.loads(json.dumps(sel.to_record())))
    check = recheck(candidates, float(sel.to_record()["tau"]), delta_s, sel.engine_id)
    assert check.consistent and check.engine == sel.engine_id and check.fast_engine == sel.fast_engine
    assert [c.engine for c in candidates if c.chosen] == [sel.engine_id]
