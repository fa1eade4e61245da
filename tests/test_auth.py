"""API keys (store, CLI), the authenticator and tenant scoping, on the private redis-server."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis
from typer.testing import CliRunner

from services.cli.main import app
from services.common.apikeys import ApiKeyStore, InvalidTenant, key_id_of
from services.common.keys import Keys
from services.common.redis_proc import PrivateRedis
from services.common.types import SamplingParams
from services.dispatcher.auth import OPEN, Authenticator, bearer, keys_required
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.errors import InvalidRequest, Unauthenticated
from services.dispatcher.intake import Intake
from services.dispatcher.tenancy import client_id, scope_intake, scoped, tenant_of
from services.dispatcher.validate import check_id

pytestmark = pytest.mark.redis


async def test_a_key_is_stored_hashed_and_found_by_its_whole_value(redis_client: Redis, keys: Keys) -> None:
    store = ApiKeyStore(redis_client, keys)
    issued = await store.create("acme", "ci")
    assert key_id_of(issued.token) == issued.record.key_id
    stored = await redis_client.hget(keys.api_keys(), issued.record.key_id)
    assert stored is not None and issued.token not in stored  # only the hash
    assert (await store.lookup(issued.token)) == issued.record
    forged = issued.token[:-4] + ("AAAA" if not issued.token.endswith("AAAA") else "BBBB")
    assert await store.lookup(forged) is None  # right id, wrong secret
    assert await store.lookup("chk_nonsense") is None
    with pytest.raises(InvalidTenant):
        await store.create("Acme Corp")
    revoked = await store.revoke(issued.record.key_id)
    assert revoked is not None and revoked.revoked
    assert (await store.lookup(issued.token)) == revoked
    assert await store.revoke("000000000000") is None


async def test_the_authenticator_refuses_missing_bad_and_revoked_keys(
    redis_client: Redis, keys: Keys
) -> None:
    store = ApiKeyStore(redis_client, keys)
    good, gone = await store.create("acme"), await store.create("acme")
    await store.revoke(gone.record.key_id)
    now = [0.0]
    auth = Authenticator(store, cache_s=5.0, clock=lambda: now[0])
    assert (await auth.principal(f"Bearer {good.token}")).tenant == "acme"
    for header, says in [
        (None, "needs an API key"),
        ("Basic abc", "Bearer <key>"),
        ("Bearer chk_000000000000_" + "x" * 43, "not valid"),
        (f"Bearer {gone.token}", "revoked"),
    ]:
        with pytest.raises(Unauthenticated, match=says):
            await auth.principal(header)
    # Revocation reaches a dispatcher that cached the key once the cache interval has passed.
    await store.revoke(good.record.key_id)
    assert (await auth.principal(f"bearer {good.token}")).tenant == "acme"
    now[0] = 5.1
    with pytest.raises(Unauthenticated, match="revoked"):
        await auth.principal(f"Bearer {good.token}")
    assert await Authenticator(None, 5.0).principal(None) == OPEN


def test_keys_are_required_unless_every_door_is_on_loopback() -> None:
    assert not keys_required("auto", ("127.0.0.1", "::1"))
    assert keys_required("auto", ("127.0.0.1", "0.0.0.0"))
    assert keys_required("keys", ("127.0.0.1", "127.0.0.1"))
    assert DispatcherSettings(auth="off").auth == "off"  # allowed: both doors default to loopback
    with pytest.raises(ValidationError, match="loopback only"):
        DispatcherSettings(auth="off", http_host="0.0.0.0")
    with pytest.raises(Unauthenticated):
        bearer("")


def test_a_tenant_s_ids_are_its_own_namespace() -> None:
    intake = Intake("run-42", 0, "wf", (), SamplingParams(max_tokens=0))
    mine = scope_intake(intake, "acme")
    assert mine.program_id == "acme~run-42" and mine.request_id.startswith("acme~")
    assert scope_intake(intake, "globex").program_id != mine.program_id
    assert scope_intake(intake, "") == intake  # open: ids as given
    assert (tenant_of(mine.program_id), client_id(mine.program_id)) == ("acme", "run-42")
    assert scoped("", "x") == "x"
    check_id("program_id", mine.program_id)  # the dispatcher's own checks take the scoped form
    for bad in ("acme~run-42", "x~y"):
        with pytest.raises(InvalidRequest, match="'~'"):
            scope_intake(Intake(bad, 0, "wf", (), SamplingParams(max_tokens=0)), "globex")


def test_the_keys_cli_creates_lists_and_revokes(
    private_redis: PrivateRedis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHIMERA_REDIS_URL", private_redis.url)
    monkeypatch.setenv("CHIMERA_KEY_PREFIX", keys.prefix)
    runner = CliRunner()
    created = runner.invoke(app, ["keys", "create", "--tenant", "acme", "--name", "ci"])
    assert created.exit_code == 0, created.output
    token = created.output.strip()
    key_id = key_id_of(token)
    assert key_id is not None
    listed = runner.invoke(app, ["keys", "list", "--json"])
    assert listed.exit_code == 0 and key_id in listed.output and token not in listed.output
    assert runner.invoke(app, ["keys", "revoke", key_id]).exit_code == 0
    assert runner.invoke(app, ["keys", "revoke", "000000000000"]).exit_code == 1
    assert runner.invoke(app, ["keys", "create", "--tenant", "Bad Name"]).exit_code == 2
    skipped = runner.invoke(app, ["keys", "create", "--tenant", "acme", "--first"])
    assert skipped.exit_code == 0 and "none created" in skipped.output
