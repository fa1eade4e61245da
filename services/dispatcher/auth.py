"""Who is calling: the API key a call carries, as a tenant (``Principal``).

Both doors take the key as a bearer token (HTTP ``Authorization: Bearer <key>``, gRPC metadata
``authorization: Bearer <key>``). Health checks, reflection and ``/metrics`` stay open and expose nothing of
any tenant.

NOTE(cache): a key's record is cached for ``auth_cache_s`` so that a busy tenant costs one Redis read per key
per interval, not one per stage; a revoked key therefore keeps working for at most that long. Unknown keys
are cached too (as unknown), so that a client retrying a bad key in a loop does not become Redis load.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from cachetools import TTLCache

from services.common.apikeys import ApiKeyStore, digest
from services.dispatcher.errors import Unauthenticated, guarded

log = logging.getLogger(__name__)

_CACHE_MAX = 10_000  # distinct keys remembered at once; past it the least recently used go first


@dataclass(frozen=True, slots=True)
class Principal:
    tenant: str  # "" when the dispatcher runs open
    key_id: str = ""


OPEN = Principal("")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def keys_required(mode: str, hosts: tuple[str, ...]) -> bool:
    """Whether calls need a key: always with ``keys``; with ``auto``, unless every door is on loopback.
    ``off`` is refused by the settings unless every door is on loopback."""
    if mode == "keys":
        return True
    if mode == "off":
        return False
    return not all(is_loopback(h) for h in hosts)


def bearer(authorization: str | None) -> str:
    """The token of an ``Authorization`` value; ``Unauthenticated`` when there is none."""
    if not authorization:
        raise Unauthenticated(
            "this dispatcher needs an API key: send 'Authorization: Bearer <key>' (HTTP) or "
            "'authorization: Bearer <key>' metadata (gRPC); `chimera keys create` makes one"
        )
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("the authorization must read 'Bearer <key>'")
    return token.strip()


class Authenticator:
    def __init__(
        self, store: ApiKeyStore | None, cache_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``store`` None: the dispatcher runs open and every call is ``OPEN``."""
        self._store = store
        # key digest -> (principal, or None with why the key is refused); ttl 0 caches nothing
        self._cache: TTLCache[str, tuple[Principal | None, str]] = TTLCache(_CACHE_MAX, cache_s, timer=clock)

    @property
    def required(self) -> bool:
        return self._store is not None

    async def principal(self, authorization: str | None) -> Principal:
        """The caller of a call with this ``Authorization`` value; raises ``Unauthenticated``."""
        if self._store is None:
            return OPEN
        token = bearer(authorization)
        d = digest(token)
        hit = self._cache.get(d)
        if hit is None:
            record = await guarded(self._store.lookup(token))
            if record is None:
                hit = (None, "the API key is not valid")
            elif record.revoked:
                hit = (None, f"API key {record.key_id} was revoked")
            else:
                hit = (Principal(record.tenant, record.key_id), "")
            self._cache[d] = hit
        if hit[0] is None:
            raise Unauthenticated(hit[1])
        return hit[0]
