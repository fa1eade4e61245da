"""The fairness term (pure), the ledger's tenant accounting, and the quota script on a real Redis."""

from __future__ import annotations

import time
from typing import cast

import pytest
from redis.asyncio import Redis

from services.common.keys import EngineField, Keys
from services.common.queue import QueueStore
from services.common.types import ChatMessage, EngineProfile, Prediction, SamplingParams, StageRequest
from services.policy.aging import wait_bound_s
from services.policy.contract import JobSize
from services.policy.fairness import EngineShare, fair_share, fairness_tokens
from services.policy.knobs import Knobs
from services.policy.ledger import Ledger
from services.policy.registry import POLICIES
from services.policy.routing import queue_score

CAP = 4096


@pytest.mark.unit
def test_no_penalty_at_or_under_the_fair_share() -> None:
    # Two tenants of weight 1 hold the engine: each is owed half.
    assert fairness_tokens(1, EngineShare(1000, 500, 1, 2), CAP) == 0.0
    assert fairness_tokens(1, EngineShare(1000, 100, 1, 2), CAP) == 0.0
    assert fairness_tokens(1, EngineShare(1000, 0, 0, 1), CAP) == 0.0  # a newcomer holds nothing yet


@pytest.mark.unit
def test_penalty_grows_linearly_to_the_cap_and_never_past_it() -> None:
    assert fairness_tokens(1, EngineShare(1000, 750, 1, 2), CAP) == pytest.approx(CAP / 2)
    assert fairness_tokens(1, EngineShare(1000, 1000, 1, 2), CAP) == pytest.approx(CAP)
    assert fairness_tokens(1, EngineShare(1000, 5000, 1, 2), CAP) == pytest.approx(CAP)  # racy read
    assert fairness_tokens(1, EngineShare(1000, 1000, 1, 2), 0) == 0.0  # fairness off


@pytest.mark.unit
def test_weights_set_the_fair_share() -> None:
    # Weight 3 beside weight 1: owed 3/4; holding 3/4 costs nothing, the weight-1 tenant holding 3/4 pays.
    assert fair_share(3, EngineShare(1000, 750, 3, 4)) == pytest.approx(0.75)
    assert fairness_tokens(3, EngineShare(1000, 750, 3, 4), CAP) == 0.0
    assert fairness_tokens(1, EngineShare(1000, 750, 1, 4), CAP) > 0
    with pytest.raises(ValueError):
        fair_share(0, EngineShare(1, 1, 1, 1))


@pytest.mark.unit
def test_a_tenant_alone_is_charged_as_beside_one_other() -> None:
    # NOTE(alone): its whole backlog gets the same full cap, a constant shift of its own order.
    assert fair_share(1, EngineShare(100, 100, 1, 1)) == 0.5
    assert fairness_tokens(1, EngineShare(100, 100, 1, 1), CAP) == pytest.approx(CAP)
    assert fairness_tokens(1, EngineShare(9000, 9000, 1, 1), CAP) == pytest.approx(CAP)


@pytest.mark.unit
def test_the_penalty_is_a_later_virtual_arrival_for_every_policy() -> None:
    knobs, size = Knobs(), JobSize(predicted_total=300, attained=0)
    for name, policy in POLICIES.items():
        plain = queue_score(policy, size, 100.0, knobs)
        assert queue_score(policy, size, 100.0, knobs, 0.0) == plain, name
        later = queue_score(policy, size, 100.0 + 1000 / knobs.aging_rate, knobs)
        assert queue_score(policy, size, 100.0, knobs, 1000.0) == pytest.approx(later), name
    assert wait_bound_s(300, 20.0, 8192, CAP) == pytest.approx((300 + CAP) / 20.0)


def _ledger() -> Ledger:
    return Ledger([("e0", "m", EngineProfile(decode_ms_per_token=20.0, max_batch_size=4))])


def _dispatch(led: Ledger, rid: str, now: float, tenant: str = "", y: int = 200) -> float:
    size = JobSize(predicted_total=y, attained=0)
    placed = led.dispatch(
        POLICIES["chimera"], Knobs(), rid, rid, 0, lambda m: size, {"m": 1.0}, now, None, tenant
    )
    return placed.score


@pytest.mark.unit
def test_a_flooding_tenant_does_not_starve_another_in_the_ledger() -> None:
    fair, plain = _ledger(), _ledger()
    for i in range(50):  # A floods first
        _dispatch(fair, f"a~{i}", float(i), "a")
        _dispatch(plain, f"{i}", float(i))
    _dispatch(fair, "b~0", 60.0, "b", y=400)
    _dispatch(plain, "b0", 60.0, y=400)
    # B jumps the flood, all but A's first request (a newcomer holding nothing is charged nothing).
    assert fair.queue_order("e0")[:2] == ["a~0", "b~0"]
    assert plain.queue_order("e0")[-1] == "b0"  # without tenants it waits behind all of it
    # A's own order is unchanged (a constant shift while alone): arrival order for equal sizes.
    assert [r for r in fair.queue_order("e0") if r.startswith("a~")] == [f"a~{i}" for i in range(50)]
    # Completing releases the tenant's accounting.
    while fair.head("e0") is not None:
        fair.complete("e0", fair.claim("e0"))
    assert fair.load("e0") == 0


@pytest.mark.unit
def test_tenant_empty_scores_are_the_scores_without_tenants() -> None:
    led = _ledger()
    knobs, size = Knobs(), JobSize(predicted_total=200, attained=0)
    for i in range(5):
        assert _dispatch(led, f"r{i}", float(i)) == queue_score(POLICIES["chimera"], size, float(i), knobs)


def _req(rid: str, prompt: str = "hello", max_tokens: int = 100) -> StageRequest:
    return StageRequest(
        rid,
        rid.rpartition(":")[0] or rid,
        0,
        "wf",
        (ChatMessage("user", prompt),),
        SamplingParams(max_tokens),
    )


@pytest.mark.redis
async def test_enqueue_and_release_keep_the_tenant_fields(redis_client: Redis, keys: Keys) -> None:
    store = QueueStore(redis_client, keys)
    info = keys.engine_info("e0")
    f = EngineField
    await store.enqueue("e0", _req("acme~r1"), Prediction(100, 150), 1.0, time.time(), {}, 0, 3)
    await store.enqueue("e0", _req("acme~r2"), Prediction(50, 60), 2.0, time.time(), {}, 0, 3)
    await store.enqueue("e0", _req("globex~r1"), Prediction(70, 80), 3.0, time.time(), {}, 0, 1)
    await store.enqueue("e0", _req("r-open"), Prediction(30, 40), 4.0, time.time(), {}, 0)
    got = await redis_client.hgetall(info)
    assert got[f.LOAD] == "250" and got[f.TENANT_LOAD_PREFIX + "acme"] == "150"
    assert got[f.TENANT_WEIGHT_PREFIX + "acme"] == "3" and got[f.TENANT_WEIGHTS] == "4"
    assert got[f.TENANT_LOAD_PREFIX + "globex"] == "70"
    for rid in ("acme~r1", "acme~r2", "globex~r1", "r-open"):
        assert await store.cancel("e0", rid) == "queued"
    after = cast(dict[str, str], await redis_client.hgetall(info))
    assert after[f.LOAD] == "0" and after[f.TENANT_WEIGHTS] == "0"
    assert not [k for k in after if k.startswith(("tenant_load:", "tenant_weight:"))]
