"""Tenant quotas at the door, and the fairness term each stage's queue score gets.

Quotas: a tenant holds at most ``max_workflows`` live workflows (a refused *new* workflow only: an admitted
one's later stages always get in, as ``max_open_requests`` lets them) and is charged ``tokens_per_minute``
over a sliding minute, on every stage. A refusal is ``Overloaded`` (gRPC RESOURCE_EXHAUSTED with the
``retry-after`` trailer, HTTP 429 with Retry-After) naming the quota.

NOTE(charge): a stage is charged its prompt tokens plus its ``max_tokens`` at admission, as OpenAI charges
its per-minute limits: both are known before it runs, the tenant can compute them and shrink them, and the
charge never depends on a model's prediction (ŷ, which the tenant cannot see) or on an answer that has not
been written yet. The prompt is counted with ``services.common.tokens`` (the predictor's count, within
about 20% of a real tokenizer's).

NOTE(retry): over ``tokens_per_minute`` the Retry-After is when the charge fits in the sliding minute again
(the script computes it). Over ``max_workflows`` a slot frees when one of the tenant's workflows ends, which
nothing predicts (the client ends it, or it lapses after ``program_ttl_s`` idle); the answer is a short poll,
``WORKFLOW_RETRY_S``, as for a full dispatcher: a retry costs one script call.

NOTE(cache): limits are cached per tenant for ``auth_cache_s``, like API keys: a change reaches every
dispatcher within that time, at one Redis read per tenant per interval.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import cast

from cachetools import TTLCache
from redis.asyncio import Redis
from redis.typing import EncodableT

from services.common.keys import EngineField, Keys
from services.common.tenants import TenantLimits, TenantStore
from services.common.tokens import approx_tokens
from services.common.types import EngineSnapshot, StageRequest
from services.dispatcher import quota_scripts as lua
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.errors import Overloaded, PermissionDenied, guarded
from services.dispatcher.tenancy import tenant_of
from services.policy.fairness import DEFAULT_WEIGHT, EngineShare, fairness_tokens

WORKFLOW_RETRY_S = 1.0
_CACHE_MAX = 10_000  # distinct tenants remembered at once; past it the least recently used go first


@dataclass(frozen=True, slots=True)
class Quota:
    """A tenant's limits in force (its record over the dispatcher's defaults); 0: unlimited."""

    max_workflows: int
    tokens_per_minute: int
    weight: int
    models: frozenset[str] | None = None  # None: every model

    @property
    def unlimited(self) -> bool:
        return self.max_workflows == 0 and self.tokens_per_minute == 0


@dataclass(frozen=True, slots=True)
class FairTerm:
    """What one stage's queue score and its ENQUEUE get of its tenant: the penalty and the weight."""

    tokens: float
    weight: int


def charge_of(req: StageRequest) -> int:
    """The tokens a stage is charged against tokens_per_minute (see NOTE(charge))."""
    return approx_tokens(req.prompt_text()) + req.sampling.max_tokens


class Bill:
    """What one dispatch was charged; given back at most once."""

    def __init__(self, refund: Callable[[], Awaitable[None]] | None) -> None:
        self._refund = refund

    async def give_back(self) -> None:
        refund, self._refund = self._refund, None
        if refund is not None:
            await refund()


class Quotas:
    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        defaults: TenantLimits,
        cache_s: float,
        program_ttl_s: int,
        fair_cap_tokens: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``defaults``: the dispatcher's settings, every field set."""
        self._r = redis
        self._k = keys
        self._store = TenantStore(redis, keys)
        self._defaults = defaults
        self._lapse_s = program_ttl_s
        self._cap = fair_cap_tokens
        self._cache: TTLCache[str, Quota] = TTLCache(_CACHE_MAX, cache_s, timer=clock)  # ttl 0: none
        self._quota = redis.register_script(lua.QUOTA)
        self._refund = redis.register_script(lua.REFUND)

    @classmethod
    def of(cls, redis: Redis, keys: Keys, settings: DispatcherSettings) -> Quotas:
        return cls(
            redis,
            keys,
            settings.tenant_defaults(),
            settings.auth_cache_s,
            settings.program_ttl_s,
            settings.fair_cap_tokens,
        )

    async def quota(self, tenant: str) -> Quota:
        """The tenant's limits in force, cached for ``cache_s``."""
        hit = self._cache.get(tenant)
        if hit is None:
            record = await guarded(self._store.get(tenant)) or TenantLimits()
            lim = record.over(self._defaults)
            models = None if lim.models is None else frozenset(lim.models)
            weight = lim.weight or DEFAULT_WEIGHT
            q = Quota(lim.max_workflows or 0, lim.tokens_per_minute or 0, weight, models)
            # Tenant "" (the dispatcher runs open) has no limits unless an operator set some for it.
            if not tenant and record == TenantLimits():
                q = Quota(0, 0, DEFAULT_WEIGHT)
            self._cache[tenant] = hit = q
        return hit

    async def permitted(self, req: StageRequest, engines: list[EngineSnapshot]) -> list[EngineSnapshot]:
        """The engines ``req``'s tenant may use (``visible``); a model pinned outside its list is
        ``PermissionDenied``, and the router then chooses among the allowed ones."""
        tenant = tenant_of(req.request_id)
        allowed = (await self.quota(tenant)).models
        if allowed is not None and req.model_pin is not None and req.model_pin not in allowed:
            name = tenant or '""'
            raise PermissionDenied(
                f"tenant {name} may not use model {req.model_pin!r}; it may use {sorted(allowed)}"
            )
        return await self.visible(tenant, engines)

    async def visible(self, tenant: str, engines: list[EngineSnapshot]) -> list[EngineSnapshot]:
        """The engines a tenant's model listing shows: those of its allowed models."""
        allowed = (await self.quota(tenant)).models
        return engines if allowed is None else [e for e in engines if e.model in allowed]

    @contextlib.asynccontextmanager
    async def charge(self, req: StageRequest, new: bool) -> AsyncIterator[Bill]:
        """Admit ``req`` (tenant-scoped ids) against its tenant's quotas and charge it, around its dispatch;
        raises ``Overloaded`` (nothing charged) when over one. A dispatch refused afterwards gets its charge
        back, and so does one that turns out to charge nothing new (``Bill.give_back``: a retry that
        re-attached to the request its first call paid for). Tenant "" without limits costs no Redis call."""
        tenant = tenant_of(req.request_id)
        q = await self.quota(tenant)
        if not tenant and q.unlimited:
            yield Bill(None)
            return
        keys = [self._k.tenant_workflows(tenant), self._k.tenant_tokens(tenant)]
        cost = charge_of(req)
        args: list[EncodableT] = [
            req.program_id,
            self._lapse_s,
            q.max_workflows,
            int(new),
            cost,
            q.tokens_per_minute,
        ]
        status, value, detail = (int(x) for x in await guarded(self._quota(keys=keys, args=args)))
        name = tenant or '""'
        if status == -1:
            raise Overloaded(
                f"tenant {name} holds {detail} live workflows, its quota max_workflows={q.max_workflows}: "
                "end one (EndProgram) or retry later",
                WORKFLOW_RETRY_S,
            )
        if status == -2:
            raise Overloaded(
                f"tenant {name} used {detail} tokens in the last minute; this stage needs {cost} (prompt + "
                f"max_tokens), over its quota tokens_per_minute={q.tokens_per_minute}",
                value / 1000.0,
            )

        async def refund() -> None:
            await guarded(self._refund(keys=keys, args=[req.program_id, detail, cost, value]))

        bill = Bill(refund)
        try:
            yield bill
        except BaseException:
            await bill.give_back()
            raise

    async def fair_term(self, engine: str, request_id: str) -> FairTerm:
        """The fairness penalty of a request of ``request_id``'s tenant on ``engine`` (one HMGET of the
        engine's info hash); none for tenant "" or with fairness off."""
        tenant = tenant_of(request_id)
        if not tenant:
            return FairTerm(0.0, DEFAULT_WEIGHT)
        weight = (await self.quota(tenant)).weight
        if self._cap <= 0:
            return FairTerm(0.0, weight)
        f = EngineField
        fields = [f.LOAD, f.TENANT_LOAD_PREFIX + tenant, f.TENANT_WEIGHT_PREFIX + tenant, f.TENANT_WEIGHTS]
        raw = cast(list[str | None], await guarded(self._r.hmget(self._k.engine_info(engine), fields)))
        load, own, own_weight, weights = (int(float(v or 0)) for v in raw)
        share = EngineShare(max(0, load), max(0, own), max(0, own_weight), max(0, weights))
        return FairTerm(fairness_tokens(weight, share, self._cap), weight)
