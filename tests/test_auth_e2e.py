"""API keys and tenant isolation on real processes: ``chimera up``'s launcher (private redis-server, router,
predictor, dispatcher, two simulated-engine workers) with keys required, driven by the SDK over gRPC and by
httpx over the OpenAI door."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import httpx
import pytest
from dispatcher_fakes import simulated_stack
from redis.asyncio import Redis

from services.common.apikeys import ApiKeyStore
from services.common.keys import Keys, ProgramField
from services.common.tenants import TenantLimits, TenantStore
from services.launcher.stack import Stack
from services.sdk.client import AsyncClient
from services.sdk.errors import ChimeraError
from services.sdk.retry import NO_RETRY
from services.sdk.types import Sampling

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SAMPLING = Sampling(max_tokens=8)


@dataclass
class Tenants:
    stack: Stack
    redis: Redis
    keys: Keys
    a: str  # tenant acme's key
    b: str  # tenant globex's key
    revoked: str  # acme's, revoked


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with pytest.MonkeyPatch.context() as mp:
        # The launcher's children inherit the environment: keys required, no caching of key records.
        mp.setenv("CHIMERA_DISPATCHER_AUTH", "keys")
        mp.setenv("CHIMERA_DISPATCHER_AUTH_CACHE_S", "0")
        with simulated_stack(tmp_path_factory.mktemp("auth")) as s:
            yield s


@pytest.fixture
async def tenants(stack: Stack) -> AsyncIterator[Tenants]:
    redis = Redis.from_url(stack.redis_url, decode_responses=True)
    keys = Keys(stack.key_prefix)
    store = ApiKeyStore(redis, keys)
    a, b, gone = await store.create("acme"), await store.create("globex"), await store.create("acme")
    await store.revoke(gone.record.key_id)
    try:
        yield Tenants(stack, redis, keys, a.token, b.token, gone.token)
    finally:
        await redis.aclose()


def _http(t: Tenants, key: str | None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(base_url=f"http://{t.stack.http_addr}/v1", headers=headers, timeout=30)


async def test_a_call_without_a_valid_key_is_refused_on_both_doors(tenants: Tenants) -> None:
    t = tenants
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for key, says in [(None, "needs an API key"), (t.revoked, "revoked"), ("chk_bogus", "not valid")]:
        async with _http(t, key) as http:
            resp = await http.post("/chat/completions", json=body)
            assert resp.status_code == 401, resp.text
            assert says in resp.json()["error"]["message"]
            assert resp.headers["www-authenticate"].startswith("Bearer")
            assert (await http.get("/models")).status_code == 401
        async with AsyncClient(t.stack.dispatcher_addr, api_key=key or "", retry=NO_RETRY) as c:
            with pytest.raises(ChimeraError) as err:
                await c.generate("hi", program_id="p-unauth", stage=0, workflow="wf", sampling=SAMPLING)
            assert err.value.code == "UNAUTHENTICATED" and says in err.value.details
            with pytest.raises(ChimeraError, match="UNAUTHENTICATED"):
                await c.end_program("p-unauth")
    # Nothing was written for the refused calls; health stays open.
    assert not [k async for k in t.redis.scan_iter(t.keys.program("*p-unauth*"))]
    async with httpx.AsyncClient(timeout=10) as h:
        assert (await h.get(f"http://{t.stack.http_addr}/health")).status_code == 200


async def test_a_tenant_cannot_touch_another_tenant_s_program(tenants: Tenants) -> None:
    t, pid = tenants, "run-42"
    async with (
        AsyncClient(t.stack.dispatcher_addr, api_key=t.a, retry=NO_RETRY) as a,
        AsyncClient(t.stack.dispatcher_addr, api_key=t.b, retry=NO_RETRY) as b,
    ):
        first = await a.generate(
            "plan", program_id=pid, stage=0, workflow="wf", sampling=SAMPLING, request_id="run-42-s0"
        )
        assert first.request_id == "run-42-s0"  # answered in the client's own terms
        row_before = await t.redis.hgetall(t.keys.program(f"acme~{pid}"))
        assert row_before[ProgramField.STAGE] == "0"

        # globex names the same program: ending it finds nothing, its stage and outcome land in its own
        # namespace, and re-using acme's request id reads nothing of acme's.
        assert not (await b.end_program(pid, outcome=0.0)).found
        theirs = await b.generate(
            "hijack", program_id=pid, stage=1, workflow="wf", sampling=SAMPLING, request_id="run-42-s0"
        )
        assert (await b.end_program(pid, outcome=0.0)).found
        async with _http(t, t.b) as http:
            resp = await http.post(
                "/chat/completions",
                json={"model": "auto", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4},
                headers={"X-Chimera-Program-Id": pid, "X-Chimera-Stage": "2"},
            )
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-chimera-program-id"] == pid
        assert theirs.request_id == "run-42-s0"
        engine = first.engine
        acme_req = await t.redis.hgetall(t.keys.request(engine, "acme~run-42-s0"))
        assert "reattached" not in acme_req  # globex's call with that id never reached acme's request
        row_after = await t.redis.hgetall(t.keys.program(f"acme~{pid}"))
        # (attained is credited as the first stage's answer is relayed, which may land after it returned)
        for field in (ProgramField.STAGE, ProgramField.REQUEST_ID, ProgramField.ENGINE):
            assert row_after[field] == row_before[field]

        # acme's workflow goes on unharmed, on its engine, and its outcome is its own.
        for stage in (1, 2):
            done = await a.generate("go on", program_id=pid, stage=stage, workflow="wf", sampling=SAMPLING)
            assert done.engine == engine and done.text
        assert (await a.end_program(pid, outcome=1.0)).found
    rows = [json.loads(fields["row"]) for _, fields in await t.redis.xrange(t.keys.outcomes())]
    labels = {(r["program_id"], r["outcome"]) for r in rows}
    # Each tenant labelled its own program only; nothing was labelled under the bare id.
    assert labels == {("acme~run-42", 1.0), ("globex~run-42", 0.0)}, labels


async def test_a_conversation_continues_only_within_its_tenant(tenants: Tenants) -> None:
    t = tenants
    turn = [{"role": "user", "content": "write a haiku about queues"}]
    async with _http(t, t.a) as a, _http(t, t.b) as b:
        first = await a.post("/chat/completions", json={"model": "auto", "messages": turn, "max_tokens": 4})
        assert first.status_code == 200, first.text
        answer = first.json()["choices"][0]["message"]["content"]
        program = first.headers["x-chimera-program-id"]
        # A chat turn offered no tool: its program no longer counts against acme's live workflows.
        assert await t.redis.zscore(t.keys.tenant_workflows("acme"), f"acme~{program}") is None
        replay = [*turn, {"role": "assistant", "content": answer}, {"role": "user", "content": "another"}]
        body = {"model": "auto", "messages": replay, "max_tokens": 4}
        theirs = await b.post("/chat/completions", json=body)
        ours = await a.post("/chat/completions", json=body)
    assert theirs.status_code == ours.status_code == 200, (theirs.text, ours.text)
    # globex sends acme's turn-2 messages word for word: it starts a program of its own.
    assert theirs.headers["x-chimera-identity"] == "new"
    assert theirs.headers["x-chimera-program-id"] != program
    assert (ours.headers["x-chimera-identity"], ours.headers["x-chimera-program-id"]) == (
        "continuation",
        program,
    )
    assert ours.headers["x-chimera-stage"] == "1"
    assert await t.redis.hget(t.keys.program(f"acme~{program}"), ProgramField.STAGE) == "1"


async def test_a_tenant_uses_only_the_models_it_is_allowed(tenants: Tenants) -> None:
    t = tenants
    small, large = "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct"
    await TenantStore(t.redis, t.keys).set("globex", TenantLimits(models=(large,)))
    async with AsyncClient(t.stack.dispatcher_addr, api_key=t.b, retry=NO_RETRY) as b:
        with pytest.raises(ChimeraError) as err:
            await b.generate("x", program_id="pin", stage=0, workflow="wf", model=small, sampling=SAMPLING)
        assert err.value.code == "PERMISSION_DENIED" and large in err.value.details
        # On an idle pool the policy starts from the fastest engine (the small model's): allowed only the
        # large one, the tenant is routed there.
        routed = await b.generate("x", program_id="auto", stage=0, workflow="wf", sampling=SAMPLING)
        assert routed.model == large
        assert [m.name for m in await b.list_models()] == [large]
        await b.end_program("auto")
    async with _http(t, t.b) as http:
        body = {"model": small, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
        resp = await http.post("/chat/completions", json=body)
        assert resp.status_code == 403 and resp.json()["error"]["type"] == "permission_error", resp.text
        assert [m["id"] for m in (await http.get("/models")).json()["data"]] == ["auto", large]
    assert not await t.redis.exists(t.keys.program("globex~pin"))  # the refusal wrote nothing
