"""Every Redis key Chimera uses, in one place.

NOTE(schema): keys that one atomic step touches together share a Redis Cluster hash tag. Everything about
one engine's queue (its sorted set, in-flight accounting, claims, the requests it holds and their output
streams) is tagged ``{<engine>}``, so the dispatch, claim, completion and reaper scripts each touch a single
slot. The program table is keyed per program (its own slot): a program's assignment is written by its own
small script before the engine step, and that order is safe because an assignment without a queued request
is harmless (the retried stage reuses it; the TTL collects it).

``redis-cli`` recipes (engine ``e0``, default prefix ``chimera``)::

    ZRANGE 'chimera:{e0}:queue' 0 -1 WITHSCORES   # waiting requests, dispatch order first
    HGETALL 'chimera:{e0}:inflight'               # request id -> predicted remaining tokens
    HGETALL 'chimera:{e0}:info'                   # model, profile, load, heartbeat
    HGETALL 'chimera:{e0}:startup'                # what a starting worker is doing (phase, progress)
    ZRANGE 'chimera:{e0}:claims' 0 -1 WITHSCORES  # running requests -> lease deadline (unix ms)
    HGETALL 'chimera:{e0}:req:<request id>'       # one request: payload, state, attempt, decision
    XRANGE 'chimera:{e0}:out:<request id>' - +    # its output events
    HGETALL 'chimera:prog:<program id>'           # program table entry
    GET 'chimera:conv:<tenant>:<sha256>'          # the program a conversation continues
    HGETALL 'chimera:{jobs}:runs'                 # background jobs: runs, failures, last success
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeVar

F = TypeVar("F", bound=Callable[..., str])


@dataclass(frozen=True, slots=True)
class KeyDoc:
    """What the README's key table says of one key (its meaning is the method's docstring summary)."""

    type: str
    written_by: str
    ttl: str


def key(type_: str, written_by: str, ttl: str = "none") -> Callable[[F], F]:
    """Mark a ``Keys`` method as a key and say what it is (``chimera docs`` builds the key table from it)."""

    def mark(fn: F) -> F:
        fn.key_doc = KeyDoc(type_, written_by, ttl)  # type: ignore[attr-defined]
        return fn

    return mark


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names under one prefix; tests use a unique prefix per run so they never touch other data."""

    prefix: str = "chimera"

    @key("SET", "worker")
    def engines(self) -> str:
        """Registered engine ids.

        Written by each worker as it registers (at start, and again whenever its info hash is missing)."""
        return f"{self.prefix}:engines"

    @key("HASH", "worker, queue scripts")
    def engine_info(self, engine: str) -> str:
        """Model, profile, ``max_num_seqs``, ``heartbeat_ms``, ``load`` (= Σ in-flight ŷ): ``EngineField``.

        ``load`` is the engine's in-flight predicted tokens (sum of ``inflight`` values), kept by the
        dispatch/complete scripts with HINCRBY so that reading the load is O(1). Written by the worker
        (profile, heartbeat) and the queue scripts (load). No TTL; liveness is ``heartbeat_ms``.
        """
        return f"{self.prefix}:{{{engine}}}:info"

    @key("ZSET", "dispatcher, reaper")
    def queue(self, engine: str) -> str:
        """Waiting request ids; **score = the policy's static priority** (Chimera: min(ŷ, cap) + β·t_enq),
        served lowest first.

        ZPOPMIN serves next. For Chimera the score is the predicted remaining tokens plus the aging rate times
        the enqueue time in seconds (``services.policy.aging``). Written by dispatch and
        the reaper; popped by the worker. No TTL.
        """
        return f"{self.prefix}:{{{engine}}}:queue"

    @key("HASH", "dispatch / completion scripts")
    def inflight(self, engine: str) -> str:
        """Request id → ŷ, predicted remaining tokens: the paper's in-flight map I[m].

        Inserted at dispatch, removed at completion, failure or cancellation. No TTL.
        """
        return f"{self.prefix}:{{{engine}}}:inflight"

    @key("HASH", "completion / dispatch / reaper scripts")
    def paused(self, engine: str) -> str:
        """Program id → predicted tokens its tool pause keeps in the engine's ``load`` (``pause_scripts``).

        Set when a stage ends in tool calls, removed when the program's next stage is dispatched, when it
        ends, or at its deadline. No TTL.
        """
        return f"{self.prefix}:{{{engine}}}:paused"

    @key("ZSET", "completion / dispatch / reaper scripts")
    def pause_deadlines(self, engine: str) -> str:
        """Paused program ids; score = when the pause lapses (unix ms, the program row's idle TTL)."""
        return f"{self.prefix}:{{{engine}}}:pause_deadlines"

    @key("ZSET", "worker claim / renew")
    def claims(self, engine: str) -> str:
        """Running request ids; score = lease deadline (unix ms).

        Written by the claim script, renewed by the worker, emptied by completion; the reaper moves
        expired entries back to ``queue``. No TTL.
        """
        return f"{self.prefix}:{{{engine}}}:claims"

    @key("LIST", "dispatcher", "trimmed to 1")
    def wake(self, engine: str) -> str:
        """Doorbell for an idle worker: dispatch pushes, the worker BLPOPs. Trimmed to one element."""
        return f"{self.prefix}:{{{engine}}}:wake"

    @key("HASH", "dispatcher, worker", "request TTL, then finished TTL")
    def request(self, engine: str, request_id: str) -> str:
        """One stage request: payload, state, attempt, ŷ, timings, decision record: ``RequestField``.

        Created by dispatch; states queued -> running -> done | failed | cancelled. TTL: the request's
        retention, set at creation and shortened at completion.
        """
        return f"{self.prefix}:{{{engine}}}:req:{request_id}"

    @key("STREAM", "worker", "finished TTL")
    def output(self, engine: str, request_id: str) -> str:
        """Output events of one request: deltas, then one final or error; read by the front door.

        Written by the worker (deltas) and the completion script (the single final or error event).
        Capped with MAXLEN; expires ``stream_retention_s`` after the final event.
        """
        return f"{self.prefix}:{{{engine}}}:out:{request_id}"

    @key("STREAM", "queue scripts (every output event)", "MAXLEN")
    def notify(self, engine: str) -> str:
        """One entry (field ``r``: the request id) per output event of the engine's requests.

        Each dispatcher process reads the notify streams of the engines it streams from with one blocking
        XREAD, then fetches the new events of the requests it serves: open streams cost no connection each.
        """
        return f"{self.prefix}:{{{engine}}}:notify"

    @key("STREAM", "completion script", "MAXLEN")
    def traces(self, engine: str) -> str:
        """One trace row per completed stage (JSON in field ``row``), appended by the completion script.

        Capped with approximate MAXLEN; read by the trace export/retraining jobs.
        """
        return f"{self.prefix}:{{{engine}}}:traces"

    @key(
        "HASH",
        "dispatcher (assign); worker (credits each completed stage)",
        "`program_ttl_s`, deleted by EndProgram",
    )
    def program(self, program_id: str) -> str:
        """Engine, model, workflow, last stage, current request, q[m], ``attained``: ``ProgramField``.

        ``attained`` is the output tokens of its finished stages (MLFQ's attained service), credited by the
        front door as it relays each final answer.

        Written by the assign script on every stage; deleted by EndProgram; TTL ``program_ttl_s``,
        refreshed on every stage so that abandoned workflows disappear.
        """
        return f"{self.prefix}:prog:{program_id}"

    @key("STRING", "dispatcher (HTTP door, after each answer)", "`conversation_ttl_s`")
    def conversation(self, tenant: str, digest: str) -> str:
        """Program id of the conversation whose messages and answer hash to ``digest``, for one tenant.

        A request without program identity whose messages up to their last assistant message hash to it
        is that program's next stage (``services.dispatcher.conversation``). Written after each answer of a
        program that no client named; looked up under the caller's tenant only.
        """
        return f"{self.prefix}:conv:{tenant}:{digest}"

    def program_pattern(self) -> str:
        """SCAN pattern over the program table."""
        return f"{self.prefix}:prog:*"

    @key("STREAM", "dispatcher", "MAXLEN")
    def outcomes(self) -> str:
        """Workflow outcomes (program_id, engine, model, workflow, outcome) from EndProgram."""
        return f"{self.prefix}:outcomes"

    @key("HASH", "`chimera keys`")
    def api_keys(self) -> str:
        """API key id → JSON record: tenant, name, SHA-256 of the key, created and revoked times.

        Never the key itself (``services.common.apikeys``). ``chimera keys create|list|revoke`` write and
        read it; the dispatcher reads one field per key it has not seen for ``auth_cache_s``.
        """
        return f"{self.prefix}:apikeys"

    @key("HASH", "`chimera tenants set`")
    def tenant_limits(self) -> str:
        """Tenant → JSON quotas: ``max_workflows``, ``tokens_per_minute``, ``weight`` (``TenantLimits``).

        A tenant without a record, or a field left at its default, gets the dispatcher's defaults
        (``tenant_*`` settings). Read by each dispatcher at most once per tenant per ``auth_cache_s``.
        """
        return f"{self.prefix}:tenants"

    @key("ZSET", "quota script (dispatcher)", "program_ttl_s past the last stage")
    def tenant_workflows(self, tenant: str) -> str:
        """A tenant's live workflows: program id → when it lapses (unix s), what ``max_workflows`` counts.

        Added by a workflow's first stage, pushed back by each later one, removed when the program ends;
        an entry past its time (an idle program's row expired) is dropped by the next admission.
        """
        return f"{self.prefix}:{{tenant:{tenant}}}:workflows"

    @key("HASH", "quota script (dispatcher)", "two minutes")
    def tenant_tokens(self, tenant: str) -> str:
        """A tenant's tokens-per-minute counter: ``window`` (unix minute), ``cur`` and ``prev`` (tokens
        charged in it and the one before), read as a sliding minute (``services.dispatcher.quota_scripts``).

        Shares its hash tag with ``tenant_workflows``: one script checks and charges both.
        """
        return f"{self.prefix}:{{tenant:{tenant}}}:tokens"

    @key("HASH", "`chimera profile`, the worker when it profiles at start")
    def profile(self, engine: str) -> str:
        """An engine's measured profile (``json``, and its scalars for redis-cli): ``ProfileField``.

        Written by ``chimera profile``; read by the worker at start to publish into ``engine_info``.
        """
        return f"{self.prefix}:{{{engine}}}:profile"

    @key("HASH", "worker, while it starts", "one hour")
    def engine_startup(self, engine: str) -> str:
        """What the engine's worker is doing while it starts: phase, detail, progress: ``StartupField``.

        Rewritten at every step of a start (fetching, assembling, converting, loading, profiling, ready) and
        read by the launcher, which fails a start whose record stops moving (``services.common.startup``),
        and by the health check, which answers with the phase until the first heartbeat.
        """
        return f"{self.prefix}:{{{engine}}}:startup"

    @key("STRING", "every dispatcher replica", "the lease (PX)")
    def reaper_lease(self) -> str:
        """The name of the dispatcher replica that runs the reaper now: one per deployment."""
        return f"{self.prefix}:reaper:lease"

    @key("HASH", "export job")
    def export_cursor(self) -> str:
        """Stream key → JSON cursor of the last exported entry.

        The jobs' keys share the ``{jobs}`` hash tag so that the export's commit script touches one slot.
        """
        return f"{self.prefix}:{{jobs}}:export:cursor"

    @key("STRING", "export job", "the lease (PX)")
    def export_lock(self) -> str:
        """Lease token of the running export."""
        return f"{self.prefix}:{{jobs}}:export:lock"

    @key("HASH", "every background job")
    def job_runs(self) -> str:
        """``<task>:<field>`` → value: each background job's runs, failures, last success and duration.

        Written by the jobs as each run ends; read by the dispatcher's ``/metrics`` at scrape time.
        """
        return f"{self.prefix}:{{jobs}}:runs"

    @key("STRING", "retrain jobs", "the lease (PX)")
    def retrain_lock(self, kind: str) -> str:
        """Lease token of the running retrain of ``kind`` (router | predictor)."""
        return f"{self.prefix}:{{jobs}}:retrain:{kind}:lock"


# Hash field names, beside the keys they belong to: Python code reads and writes them through these names.
# The Lua scripts in ``queue_scripts`` and ``program_scripts`` spell the same strings (Lua cannot import
# them); tests/test_keys.py pins every one, so a rename is deliberate.


class EngineField:
    """Fields of ``Keys.engine_info``."""

    MODEL: Final = "model"
    KIND: Final = "kind"
    DECODE_MS_PER_TOKEN: Final = "decode_ms_per_token"
    MAX_BATCH_SIZE: Final = "max_batch_size"
    MAX_NUM_SEQS: Final = "max_num_seqs"
    # "1" when the engine reads tool calls out of its answers (a vLLM engine with a tool parser): only those
    # are candidates for a request that lets the model call a tool. Missing (an older worker): "1".
    TOOLS: Final = "tools"
    PROFILE: Final = "profile"  # the whole measured profile as JSON (step curve, prefill cost)
    PROFILE_SOURCE: Final = "profile_source"
    TIME_SCALE: Final = "time_scale"
    WORKER_ID: Final = "worker_id"
    HEARTBEAT_MS: Final = "heartbeat_ms"
    RUNNING: Final = "running"
    HELD: Final = "held"
    # The worker's verdict on its engine, refreshed with every heartbeat: "ok", or "dead" with the reason
    # (a dead engine's worker also zeroes heartbeat_ms, so readers that only look at liveness skip it).
    HEALTH: Final = "health"
    HEALTH_REASON: Final = "health_reason"
    # Distinct worker deaths a request may be running in before it is failed as poison (the worker's
    # setting, read by every reaper of the engine); and the last-chance request running alone, if any.
    MAX_ATTEMPTS: Final = "max_attempts"
    ISOLATING: Final = "isolating"
    LEASE_MS: Final = "lease_ms"  # how long its worker's leases last: a reap gap longer than this is a stall
    REAPED_MS: Final = "reaped_ms"  # Redis time of the last REAP of its claims
    REAP_HELD: Final = "reap_held"  # the last REAP held its round after a stall (see queue_scripts.REAP)
    LOAD: Final = "load"  # sum of the engine's in-flight predicted tokens, kept by the queue scripts
    DRAINED: Final = "drained"  # predicted tokens released so far (a counter): how fast the queue drains
    # Fair shares (services.policy.fairness), kept by the queue scripts: each tenant's part of ``load`` and
    # its weight, as ``<prefix><tenant>`` fields while it holds work on the engine, and their weights' sum.
    TENANT_LOAD_PREFIX: Final = "tenant_load:"
    TENANT_WEIGHT_PREFIX: Final = "tenant_weight:"
    TENANT_WEIGHTS: Final = "tenant_weights"


class EngineHealth:
    """Values of ``EngineField.HEALTH``."""

    OK: Final = "ok"
    DEAD: Final = "dead"


class RequestField:
    """Fields of ``Keys.request``."""

    PAYLOAD: Final = "payload"
    PROGRAM_ID: Final = "program_id"
    Y: Final = "y"
    Y90: Final = "y90"
    SCORE: Final = "score"
    T_ENQ: Final = "t_enq"
    STATE: Final = "state"
    ATTEMPT: Final = "attempt"
    DECISION: Final = "decision"
    WORKER: Final = "worker"
    T_CLAIM: Final = "t_claim"
    T_FIRST_CLAIM: Final = "t_first_claim"
    T_DONE: Final = "t_done"
    CANCEL: Final = "cancel"
    DEATHS: Final = "deaths"  # distinct worker deaths it was charged with (see queue_scripts GIVE_BACK)
    DIED_ON: Final = "died_on"  # JSON list of those workers' ids
    REATTACHED: Final = "reattached"  # when a client's retry last re-attached to it (unix s)
    SENT: Final = "sent"  # chars of the current attempt's text published (PUBLISH writes each delta once)


class ProgramField:
    """Fields of ``Keys.program``."""

    ENGINE: Final = "engine"
    MODEL: Final = "model"
    WORKFLOW: Final = "workflow"
    STAGE: Final = "stage"
    REQUEST_ID: Final = "request_id"
    CONFIDENCES: Final = "confidences"
    CREATED: Final = "created"
    UPDATED: Final = "updated"
    ATTAINED: Final = "attained"
    LAST_OUTPUT: Final = "last_output"  # output tokens of the last finished stage (an open loop's feature)


class ProfileField:
    """Fields of ``Keys.profile``."""

    JSON: Final = "json"
    DECODE_MS_PER_TOKEN: Final = "decode_ms_per_token"
    MAX_BATCH_SIZE: Final = "max_batch_size"
    PREFILL_MS_PER_TOKEN: Final = "prefill_ms_per_token"
    MEASURED_UNIX: Final = "measured_unix"


class StartupField:
    """Fields of ``Keys.engine_startup``."""

    PHASE: Final = "phase"
    DETAIL: Final = "detail"
    DONE: Final = "done"
    TOTAL: Final = "total"
    UNIT: Final = "unit"
    STARTED_MS: Final = "started_ms"
    UPDATED_MS: Final = "updated_ms"
    WORKER_ID: Final = "worker_id"
