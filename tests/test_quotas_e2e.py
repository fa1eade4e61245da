"""Tenant quotas on real processes: ``chimera up``'s launcher with keys required; a tenant over its workflow
quota and one over its token rate get 429 + Retry-After on HTTP and RESOURCE_EXHAUSTED with the retry-after
trailer on gRPC, while another tenant is served."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from dispatcher_fakes import simulated_stack
from redis.asyncio import Redis

from services.common.apikeys import ApiKeyStore
from services.common.keys import Keys
from services.common.tenants import TenantLimits, TenantStore
from services.launcher.stack import Stack
from services.sdk.client import AsyncClient
from services.sdk.errors import ChimeraError
from services.sdk.retry import NO_RETRY
from services.sdk.types import Sampling

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SAMPLING = Sampling(max_tokens=8)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CHIMERA_DISPATCHER_AUTH", "keys")
        mp.setenv("CHIMERA_DISPATCHER_AUTH_CACHE_S", "0")  # limits are read afresh on every call
        with simulated_stack(tmp_path_factory.mktemp("quotas")) as s:
            yield s


async def test_over_quota_is_429_and_resource_exhausted_while_another_tenant_is_served(stack: Stack) -> None:
    redis = Redis.from_url(stack.redis_url, decode_responses=True)
    keys = Keys(stack.key_prefix)
    try:
        store = ApiKeyStore(redis, keys)
        few, slow, free = [await store.create(t) for t in ("few", "slow", "free")]
        tenants = TenantStore(redis, keys)
        await tenants.set("few", TenantLimits(max_workflows=1))
        await tenants.set("slow", TenantLimits(tokens_per_minute=60))
        body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40}
        http = f"http://{stack.http_addr}/v1"

        # gRPC: "few" holds one live workflow; a second is refused, its first's later stage is served.
        async with AsyncClient(stack.dispatcher_addr, api_key=few.token, retry=NO_RETRY) as c:
            await c.generate("hi", program_id="w1", stage=0, workflow="wf", sampling=SAMPLING)
            with pytest.raises(ChimeraError) as err:
                await c.generate("hi", program_id="w2", stage=0, workflow="wf", sampling=SAMPLING)
            assert err.value.code == "RESOURCE_EXHAUSTED" and "max_workflows=1" in err.value.details
            assert err.value.retry_after_s is not None and err.value.retry_after_s >= 1
            await c.generate("again", program_id="w1", stage=1, workflow="wf", sampling=SAMPLING)
        # HTTP: "slow" is charged prompt + max_tokens (40 + a few): the second call is over 60 a minute.
        async with httpx.AsyncClient(timeout=30) as h:
            auth = {"Authorization": f"Bearer {slow.token}"}
            assert (await h.post(f"{http}/chat/completions", json=body, headers=auth)).status_code == 200
            resp = await h.post(f"{http}/chat/completions", json=body, headers=auth)
            assert resp.status_code == 429, resp.text
            assert "tokens_per_minute=60" in resp.json()["error"]["message"]
            assert 1 <= int(resp.headers["retry-after"]) <= 120
            # The same tenant on gRPC, and "few" over HTTP, are refused the same way.
            async with AsyncClient(stack.dispatcher_addr, api_key=slow.token, retry=NO_RETRY) as c:
                with pytest.raises(ChimeraError, match="RESOURCE_EXHAUSTED"):
                    await c.generate(
                        "hi", program_id="s2", stage=0, workflow="wf", sampling=Sampling(max_tokens=40)
                    )
            # Another tenant is served meanwhile, on both doors.
            ok = await h.post(
                f"{http}/chat/completions", json=body, headers={"Authorization": f"Bearer {free.token}"}
            )
            assert ok.status_code == 200, ok.text
        async with AsyncClient(stack.dispatcher_addr, api_key=free.token, retry=NO_RETRY) as c:
            for i in range(3):
                await c.generate("hi", program_id=f"f{i}", stage=0, workflow="wf", sampling=SAMPLING)
    finally:
        await redis.aclose()


async def test_a_retry_that_re_attaches_is_not_charged_twice(stack: Stack) -> None:
    redis = Redis.from_url(stack.redis_url, decode_responses=True)
    keys = Keys(stack.key_prefix)
    try:
        key = await ApiKeyStore(redis, keys).create("retrier")
        tenants = TenantStore(redis, keys)
        await tenants.set("retrier", TenantLimits(tokens_per_minute=10_000))
        async with AsyncClient(stack.dispatcher_addr, api_key=key.token, retry=NO_RETRY) as c:
            first = await c.generate(
                "hi", program_id="r1", stage=0, workflow="wf", sampling=SAMPLING, request_id="r1-s0"
            )
            charged = int(await redis.hget(keys.tenant_tokens("retrier"), "cur") or 0)
            again = await c.generate(
                "hi", program_id="r1", stage=0, workflow="wf", sampling=SAMPLING, request_id="r1-s0"
            )
        assert again.text == first.text  # the same request, streamed again
        assert charged > 0
        after = int(await redis.hget(keys.tenant_tokens("retrier"), "cur") or 0)
        assert after in (charged, 0), "the re-attached retry was charged again"  # 0: the minute turned
    finally:
        await redis.aclose()
