"""Tenant quotas: the quota script and ``Quotas`` on a real Redis (concurrency, tokens per minute, refunds,
the Retry-After), and the stored limits over the dispatcher's defaults."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from services.common.keys import Keys
from services.common.tenants import TenantLimits, TenantStore
from services.common.types import ChatMessage, SamplingParams, StageRequest
from services.dispatcher.errors import Overloaded
from services.dispatcher.quotas import Quotas, charge_of

DEFAULTS = TenantLimits(0, 0, 1)


def _req(program: str, rid: str, max_tokens: int = 100) -> StageRequest:
    return StageRequest(
        rid, program, 0, "wf", (ChatMessage("user", "hello there"),), SamplingParams(max_tokens)
    )


def _quotas(redis: Redis, keys: Keys, defaults: TenantLimits = DEFAULTS) -> Quotas:
    return Quotas(redis, keys, defaults, cache_s=0.0, program_ttl_s=3600, fair_cap_tokens=4096)


@pytest.mark.unit
def test_limits_over_defaults_and_their_json() -> None:
    record = TenantLimits(max_workflows=3)
    assert record.over(TenantLimits(0, 1000, 2)) == TenantLimits(3, 1000, 2)
    assert TenantLimits.from_json(record.to_json()) == record
    with pytest.raises(ValueError):
        TenantLimits(weight=0)
    with pytest.raises(ValueError):
        TenantLimits(tokens_per_minute=-1)


@pytest.mark.redis
async def test_a_new_workflow_past_max_workflows_is_refused_later_stages_get_in(
    redis_client: Redis, keys: Keys
) -> None:
    await TenantStore(redis_client, keys).set("acme", TenantLimits(max_workflows=2))
    q = _quotas(redis_client, keys)
    for p in ("acme~p1", "acme~p2"):
        async with q.charge(_req(p, f"{p}:0"), new=True):
            pass
    with pytest.raises(Overloaded, match="max_workflows=2") as err:
        async with q.charge(_req("acme~p3", "acme~p3:0"), new=True):
            pass
    assert err.value.retry_after == "1"
    async with q.charge(_req("acme~p1", "acme~p1:1"), new=False):  # a later stage always gets in
        pass
    async with q.charge(_req("globex~p1", "globex~p1:0"), new=True):  # another tenant is not counted
        pass
    # A workflow refused after its charge (engine full) gives its place back.
    with pytest.raises(RuntimeError):
        async with q.charge(_req("acme~p1", "acme~p1:2"), new=False):
            raise RuntimeError("refused downstream")
    assert await redis_client.zcard(keys.tenant_workflows("acme")) == 2
    # Ending one frees its place.
    await redis_client.zrem(keys.tenant_workflows("acme"), "acme~p1")
    async with q.charge(_req("acme~p3", "acme~p3:0"), new=True):
        pass


@pytest.mark.redis
async def test_tokens_per_minute_refuses_with_when_it_fits_and_refunds(
    redis_client: Redis, keys: Keys
) -> None:
    cost = charge_of(_req("p", "r"))
    await TenantStore(redis_client, keys).set("acme", TenantLimits(tokens_per_minute=cost * 3))
    q = _quotas(redis_client, keys)
    for i in range(3):
        async with q.charge(_req(f"acme~p{i}", f"acme~p{i}:0"), new=True):
            pass
    with pytest.raises(Overloaded, match="tokens_per_minute") as err:
        async with q.charge(_req("acme~p9", "acme~p9:0"), new=True):
            pass
    assert 0 < err.value.retry_after_s <= 120
    assert int(err.value.retry_after) >= 1
    # The refused one was not counted as a workflow, and a refund gives tokens back.
    assert await redis_client.zscore(keys.tenant_workflows("acme"), "acme~p9") is None
    usage = await TenantStore(redis_client, keys).usage("acme", __import__("time").time())
    assert usage.workflows == 3 and usage.tokens_last_minute >= cost * 3 - 1


@pytest.mark.redis
async def test_open_tenant_has_no_limits_unless_set(redis_client: Redis, keys: Keys) -> None:
    q = _quotas(redis_client, keys, TenantLimits(1, 1, 1))  # defaults bind named tenants only
    for i in range(3):
        async with q.charge(_req(f"p{i}", f"p{i}:0"), new=True):
            pass
    assert await redis_client.exists(keys.tenant_workflows("")) == 0
    async with q.charge(_req("acme~p0", "acme~p0:0"), new=True):  # a stage above the whole quota runs
        pass  # alone in its minute rather than never
    with pytest.raises(Overloaded):
        async with q.charge(_req("acme~p1", "acme~p1:0"), new=True):
            pass


@pytest.mark.redis
async def test_a_charge_given_back_is_refunded_once(redis_client: Redis, keys: Keys) -> None:
    """A retry that re-attaches to its first call's request gives its charge back (the dispatcher calls
    ``give_back``); giving back twice refunds once."""
    cost = charge_of(_req("p", "r"))
    await TenantStore(redis_client, keys).set("acme", TenantLimits(tokens_per_minute=cost * 10))
    q = _quotas(redis_client, keys)
    async with q.charge(_req("acme~p1", "acme~p1:0"), new=True):
        pass
    async with q.charge(_req("acme~p1", "acme~p1:0"), new=False) as bill:
        await bill.give_back()
        await bill.give_back()
    tokens = await redis_client.hget(keys.tenant_tokens("acme"), "cur")
    assert int(tokens or 0) in (cost, 0)  # one charge left (0 only if the minute turned in between)
    assert await redis_client.zcard(keys.tenant_workflows("acme")) == 1
