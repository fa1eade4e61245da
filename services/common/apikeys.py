"""API keys: each bound to one tenant, stored hashed in Redis, shown in full only when created.

A key reads ``chk_<key id>_<secret>``. The key id names the record (``Keys.api_keys`` field), so a lookup is
one HGET; the record holds the SHA-256 of the whole key, compared in constant time.

NOTE(hash): a plain SHA-256, not a password hash (bcrypt, argon2): the secret is 256 random bits, so there
is nothing to guess and no reason to spend milliseconds of CPU per request on key stretching. Whoever reads
Redis learns the tenants and key ids, never a usable key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import asdict, dataclass, replace
from typing import cast

from redis.asyncio import Redis

from services.common.keys import Keys

TOKEN_PREFIX = "chk"
_TOKEN = re.compile(rf"{TOKEN_PREFIX}_([0-9a-f]{{12}})_([A-Za-z0-9_-]{{43}})")
TENANT = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
TENANT_RULE = "1 to 63 of a-z 0-9 _ -, starting with a letter or digit"
MAX_NAME_CHARS = 200


class InvalidTenant(ValueError):
    pass


def check_tenant(tenant: str) -> str:
    """``tenant`` if it is a valid tenant name, else ``InvalidTenant``: it becomes part of every id the
    tenant's requests carry in Redis."""
    if not TENANT.fullmatch(tenant):
        raise InvalidTenant(f"tenant {tenant!r}: a tenant name is {TENANT_RULE}")
    return tenant


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One key's record; never the key itself."""

    key_id: str
    tenant: str
    name: str
    digest: str  # sha256 hex of the whole key
    created_unix: float
    revoked_unix: float | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_unix is not None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str) -> ApiKey:
        return cls(**json.loads(raw))


@dataclass(frozen=True, slots=True)
class IssuedKey:
    record: ApiKey
    token: str  # the only time the whole key exists outside its holder


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def key_id_of(token: str) -> str | None:
    """The key id a well-formed key names; None for anything else."""
    m = _TOKEN.fullmatch(token)
    return m.group(1) if m else None


class ApiKeyStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._r = redis
        self._key = keys.api_keys()

    async def create(self, tenant: str, name: str = "") -> IssuedKey:
        check_tenant(tenant)
        if len(name) > MAX_NAME_CHARS:
            raise ValueError(f"a key name holds at most {MAX_NAME_CHARS} characters")
        while True:
            key_id = secrets.token_hex(6)
            token = f"{TOKEN_PREFIX}_{key_id}_{secrets.token_urlsafe(32)}"
            record = ApiKey(key_id, tenant, name, digest(token), time.time())
            # HSETNX: a key id drawn twice (48 random bits) must not overwrite an existing key.
            if await self._r.hsetnx(self._key, key_id, record.to_json()):
                return IssuedKey(record, token)

    async def list(self) -> list[ApiKey]:
        raw = cast(dict[str, str], await self._r.hgetall(self._key))
        return sorted((ApiKey.from_json(v) for v in raw.values()), key=lambda k: k.created_unix)

    async def get(self, key_id: str) -> ApiKey | None:
        raw = cast(str | None, await self._r.hget(self._key, key_id))  # the client decodes responses
        return ApiKey.from_json(raw) if raw else None

    async def revoke(self, key_id: str) -> ApiKey | None:
        """Mark the key revoked (its record stays, for the audit trail); None if there is no such key."""
        record = await self.get(key_id)
        if record is None:
            return None
        if not record.revoked:
            record = replace(record, revoked_unix=time.time())
            await self._r.hset(self._key, key_id, record.to_json())
        return record

    async def lookup(self, token: str) -> ApiKey | None:
        """The record of a valid key (revoked or not); None for a malformed or unknown key."""
        key_id = key_id_of(token)
        if key_id is None:
            return None
        record = await self.get(key_id)
        if record is None or not hmac.compare_digest(record.digest, digest(token)):
            return None
        return record
