"""Per-tenant quotas as operators set them (``chimera tenants``) and dispatchers read them.

A tenant's record holds only what the operator set; every field left unset takes the dispatcher's default
(``CHIMERA_DISPATCHER_TENANT_*``), so changing a default reaches every tenant that did not override it.
0 means unlimited for both quotas.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import cast

from redis.asyncio import Redis

from services.common.apikeys import check_tenant
from services.common.keys import Keys

MAX_WEIGHT = 1000


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """One tenant's quotas; None: the dispatcher's default."""

    max_workflows: int | None = None  # live workflows (programs) at once; 0: unlimited
    tokens_per_minute: int | None = None  # prompt + max_tokens charged per stage, over a sliding minute
    weight: int | None = None  # fair-share weight in the queue order (services.policy.fairness)
    models: tuple[str, ...] | None = None  # the models it may use (routed to or pinned); None: every model

    def __post_init__(self) -> None:
        for name in ("max_workflows", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 (0: unlimited)")
        if self.weight is not None and not 1 <= self.weight <= MAX_WEIGHT:
            raise ValueError(f"weight must be in 1..{MAX_WEIGHT}")

    def over(self, defaults: TenantLimits) -> TenantLimits:
        """These limits with every unset field taken from ``defaults``."""
        return TenantLimits(
            self.max_workflows if self.max_workflows is not None else defaults.max_workflows,
            self.tokens_per_minute if self.tokens_per_minute is not None else defaults.tokens_per_minute,
            self.weight if self.weight is not None else defaults.weight,
            self.models if self.models is not None else defaults.models,
        )

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None}, sort_keys=True)

    @classmethod
    def from_json(cls, raw: str) -> TenantLimits:
        fields = json.loads(raw)
        if "models" in fields:
            fields["models"] = tuple(fields["models"])
        known = ("max_workflows", "tokens_per_minute", "weight", "models")
        return cls(**{k: fields[k] for k in known if k in fields})


@dataclass(frozen=True, slots=True)
class Usage:
    """What a tenant holds now."""

    workflows: int  # live workflows counted against max_workflows
    tokens_last_minute: int  # the sliding minute's charge, as the quota script reads it


class TenantStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        """``redis`` decodes responses, as every client in Chimera does."""
        self._r = redis
        self._k = keys

    async def get(self, tenant: str) -> TenantLimits | None:
        raw = cast(str | None, await self._r.hget(self._k.tenant_limits(), tenant))
        return TenantLimits.from_json(raw) if raw else None

    async def set(self, tenant: str, change: TenantLimits) -> TenantLimits:
        """Merge ``change`` (its set fields) into the tenant's record; returns the record."""
        check_tenant(tenant)
        current = await self.get(tenant) or TenantLimits()
        merged = replace(
            current, **{k: v for k, v in asdict(change).items() if v is not None}
        )  # unset fields keep the record's value
        await self._r.hset(self._k.tenant_limits(), tenant, merged.to_json())
        return merged

    async def clear(self, tenant: str) -> bool:
        """Drop the tenant's record: it gets the defaults again. False if it had none."""
        return bool(await self._r.hdel(self._k.tenant_limits(), tenant))

    async def all(self) -> dict[str, TenantLimits]:
        raw = cast(dict[str, str], await self._r.hgetall(self._k.tenant_limits()))
        return {t: TenantLimits.from_json(v) for t, v in sorted(raw.items())}

    async def usage(self, tenant: str, now_unix: float) -> Usage:
        """Live workflows and the sliding minute's tokens (read only: lapsed entries are not dropped here)."""
        pipe = self._r.pipeline(transaction=False)
        pipe.zcount(self._k.tenant_workflows(tenant), f"({now_unix}", "+inf")
        pipe.hmget(self._k.tenant_tokens(tenant), ["window", "cur", "prev"])
        live, (window, cur, prev) = await pipe.execute()
        minute = int(now_unix // 60)
        into = now_unix / 60 - minute
        c, p = float(cur or 0), float(prev or 0)
        if window is None or int(window) < minute - 1:
            used = 0.0
        elif int(window) == minute - 1:
            used = c * (1 - into)
        else:
            used = p * (1 - into) + c
        return Usage(int(live), int(used))
