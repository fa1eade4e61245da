"""Every Redis key string and hash field name is pinned: changing one is a schema change, made on purpose.

Operators' ``redis-cli`` recipes, dashboards and a rolling upgrade (old workers beside new dispatchers) all
depend on these strings, and the Lua scripts spell the field names themselves.
"""

from __future__ import annotations

import inspect
import re

import pytest

from services.common import pause_scripts, program_scripts, queue_scripts
from services.common.keys import EngineField, Keys, ProfileField, ProgramField, RequestField, StartupField

pytestmark = pytest.mark.unit

K = Keys("chimera")
PINNED = {
    "engines": (K.engines(), "chimera:engines"),
    "engine_info": (K.engine_info("e0"), "chimera:{e0}:info"),
    "queue": (K.queue("e0"), "chimera:{e0}:queue"),
    "inflight": (K.inflight("e0"), "chimera:{e0}:inflight"),
    "claims": (K.claims("e0"), "chimera:{e0}:claims"),
    "paused": (K.paused("e0"), "chimera:{e0}:paused"),
    "pause_deadlines": (K.pause_deadlines("e0"), "chimera:{e0}:pause_deadlines"),
    "wake": (K.wake("e0"), "chimera:{e0}:wake"),
    "request": (K.request("e0", "r1"), "chimera:{e0}:req:r1"),
    "output": (K.output("e0", "r1"), "chimera:{e0}:out:r1"),
    "traces": (K.traces("e0"), "chimera:{e0}:traces"),
    "notify": (K.notify("e0"), "chimera:{e0}:notify"),
    "program": (K.program("p1"), "chimera:prog:p1"),
    "program_pattern": (K.program_pattern(), "chimera:prog:*"),
    "conversation": (K.conversation("acme", "ab12"), "chimera:conv:acme:ab12"),
    "api_keys": (K.api_keys(), "chimera:apikeys"),
    "tenant_limits": (K.tenant_limits(), "chimera:tenants"),
    "tenant_workflows": (K.tenant_workflows("acme"), "chimera:{tenant:acme}:workflows"),
    "tenant_tokens": (K.tenant_tokens("acme"), "chimera:{tenant:acme}:tokens"),
    "reaper_lease": (K.reaper_lease(), "chimera:reaper:lease"),
    "outcomes": (K.outcomes(), "chimera:outcomes"),
    "profile": (K.profile("e0"), "chimera:{e0}:profile"),
    "engine_startup": (K.engine_startup("e0"), "chimera:{e0}:startup"),
    "export_cursor": (K.export_cursor(), "chimera:{jobs}:export:cursor"),
    "export_lock": (K.export_lock(), "chimera:{jobs}:export:lock"),
    "job_runs": (K.job_runs(), "chimera:{jobs}:runs"),
    "retrain_lock": (K.retrain_lock("router"), "chimera:{jobs}:retrain:router:lock"),
}
FIELDS = {
    EngineField: {
        "model", "kind", "decode_ms_per_token", "max_batch_size", "max_num_seqs", "tools", "profile",
        "profile_source", "time_scale", "worker_id", "heartbeat_ms", "running", "held", "load", "drained",
        "health", "health_reason", "max_attempts", "isolating", "lease_ms", "reaped_ms", "reap_held",
        "tenant_load:", "tenant_weight:", "tenant_weights",
    },
    RequestField: {
        "payload", "program_id", "y", "y90", "score", "t_enq", "state", "attempt", "decision", "worker",
        "t_claim", "t_first_claim", "t_done", "cancel", "deaths", "died_on", "reattached", "sent",
    },
    ProgramField: {
        "engine", "model", "workflow", "stage", "request_id", "confidences", "created", "updated", "attained",
        "last_output",
    },
    ProfileField: {"json", "decode_ms_per_token", "max_batch_size", "prefill_ms_per_token", "measured_unix"},
    StartupField: {"phase", "detail", "done", "total", "unit", "started_ms", "updated_ms", "worker_id"},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PINNED))
def test_key_strings_are_pinned(name: str) -> None:
    got, want = PINNED[name]
    assert got == want


def test_every_key_is_pinned_and_documented() -> None:
    methods = {n for n, f in inspect.getmembers(Keys, inspect.isfunction) if not n.startswith("_")}
    assert methods == set(PINNED), "a new key needs its string pinned here"
    undocumented = sorted(
        n for n in methods - {"program_pattern"} if not hasattr(getattr(Keys, n), "key_doc")
    )
    assert undocumented == [], "mark each key with @key(type, written_by, ttl)"


def test_keys_of_one_engine_share_its_hash_tag() -> None:
    # One Lua script touches one engine's keys: on a Redis Cluster they must map to one slot.
    for key in (
        K.engine_info("e0"), K.queue("e0"), K.inflight("e0"), K.claims("e0"), K.request("e0", "r"),
        K.output("e0", "r"), K.notify("e0"),
    ):  # fmt: skip
        assert "{e0}" in key


@pytest.mark.parametrize("cls", list(FIELDS), ids=lambda c: c.__name__)
def test_field_names_are_pinned(cls: type) -> None:
    values = {v for n, v in vars(cls).items() if n.isupper()}
    assert values == FIELDS[cls]


def test_the_lua_scripts_spell_only_declared_fields() -> None:
    """Lua cannot import the constants: every quoted name a script passes to a hash command is declared."""
    declared = set().union(*FIELDS.values())
    states = {"queued", "running", "done", "failed", "cancelled"}  # values of the state field, not names

    quoted: set[str] = set()
    scripts = [*vars(queue_scripts).items(), *vars(program_scripts).items(), *vars(pause_scripts).items()]
    for name, script in scripts:
        if name.isupper() and isinstance(script, str):
            for call in re.findall(r"redis\.call\('H(?:SET|GET|MGET|INCRBY|DEL)'[^)]*\)", script):
                quoted |= set(re.findall(r"'([a-z_0-9]+)'", call)) - {
                    "HSET",
                    "HGET",
                    "HMGET",
                    "HINCRBY",
                    "HDEL",
                }
    assert quoted and quoted - states <= declared, sorted(quoted - states - declared)
