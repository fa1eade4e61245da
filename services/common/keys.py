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
    ZRANGE 'chimera:{e0}:claims' 0 -1 WITHSCORES  # running requests -> lease deadline (unix ms)
    HGETALL 'chimera:{e0}:req:<request id>'       # one request: payload, state, attempt, decision
    XRANGE 'chimera:{e0}:out:<request id>' - +    # its output events
    HGETALL 'chimera:prog:<program id>'           # program table entry
    HGETALL 'chimera:{jobs}:runs'                 # background jobs: runs, failures, last success
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names under one prefix; tests use a unique prefix per run so they never touch other data."""

    prefix: str = "chimera"

    def engines(self) -> str:
        """SET of engine ids that have registered. Written by workers at start; never expires."""
        return f"{self.prefix}:engines"

    def engine_info(self, engine: str) -> str:
        """HASH: model, profile fields, max_num_seqs, worker_id, heartbeat_ms, running, and ``load``.

        ``load`` is the engine's in-flight predicted tokens (sum of ``inflight`` values), kept by the
        dispatch/complete scripts with HINCRBY so that reading the load is O(1). Written by the worker
        (profile, heartbeat) and the queue scripts (load). No TTL; liveness is ``heartbeat_ms``.
        """
        return f"{self.prefix}:{{{engine}}}:info"

    def queue(self, engine: str) -> str:
        """ZSET request_id -> score; ZPOPMIN serves next.

        The score is the policy's static priority (for Chimera, predicted remaining tokens plus the aging
        rate times the enqueue time in seconds; see ``services.dispatcher.policy``). Written by dispatch and
        the reaper; popped by the worker. No TTL.
        """
        return f"{self.prefix}:{{{engine}}}:queue"

    def inflight(self, engine: str) -> str:
        """HASH request_id -> predicted remaining tokens (integer): the paper's in-flight map I[m].

        Inserted at dispatch, removed at completion, failure or cancellation. No TTL.
        """
        return f"{self.prefix}:{{{engine}}}:inflight"

    def claims(self, engine: str) -> str:
        """ZSET request_id -> lease deadline (unix ms) of requests a worker has popped and is running.

        Written by the claim script, renewed by the worker, emptied by completion; the reaper moves
        expired entries back to ``queue``. No TTL.
        """
        return f"{self.prefix}:{{{engine}}}:claims"

    def wake(self, engine: str) -> str:
        """LIST used only as a doorbell: dispatch pushes, an idle worker BLPOPs. Trimmed to one element."""
        return f"{self.prefix}:{{{engine}}}:wake"

    def request(self, engine: str, request_id: str) -> str:
        """HASH for one stage request: payload (JSON), state, attempt, predictions, timings, decision.

        Created by dispatch; states queued -> running -> done | failed | cancelled. TTL: the request's
        retention, set at creation and shortened at completion.
        """
        return f"{self.prefix}:{{{engine}}}:req:{request_id}"

    def output(self, engine: str, request_id: str) -> str:
        """STREAM of output events for one request (delta | final | error), read by the front door.

        Written by the worker (deltas) and the completion script (the single final or error event).
        Capped with MAXLEN; expires ``stream_retention_s`` after the final event.
        """
        return f"{self.prefix}:{{{engine}}}:out:{request_id}"

    def traces(self, engine: str) -> str:
        """STREAM of completed-stage trace rows (JSON in field ``row``), appended by the completion script.

        Capped with approximate MAXLEN; read by the trace export/retraining jobs.
        """
        return f"{self.prefix}:{{{engine}}}:traces"

    def program(self, program_id: str) -> str:
        """HASH: engine, model, workflow, last stage, current request, router confidences, created, and
        ``attained`` (output tokens of its finished stages, credited by the front door as it relays them).

        Written by the assign script on every stage; deleted by EndProgram; TTL ``program_ttl_s``,
        refreshed on every stage so that abandoned workflows disappear.
        """
        return f"{self.prefix}:prog:{program_id}"

    def program_pattern(self) -> str:
        """SCAN pattern over the program table."""
        return f"{self.prefix}:prog:*"

    def outcomes(self) -> str:
        """STREAM of workflow outcomes (program_id, engine, model, workflow, outcome) from EndProgram."""
        return f"{self.prefix}:outcomes"

    def profile(self, engine: str) -> str:
        """HASH: the measured profile of an engine (decode_ms_per_token, max_batch_size, step curve JSON).

        Written by ``chimera profile``; read by the worker at start to publish into ``engine_info``.
        """
        return f"{self.prefix}:{{{engine}}}:profile"

    def export_cursor(self) -> str:
        """HASH stream key -> JSON cursor of the last exported entry. Written only by the export job.

        The jobs' keys share the ``{jobs}`` hash tag so that the export's commit script touches one slot.
        """
        return f"{self.prefix}:{{jobs}}:export:cursor"

    def export_lock(self) -> str:
        """STRING lease token of the running export; PX = the lease."""
        return f"{self.prefix}:{{jobs}}:export:lock"

    def job_runs(self) -> str:
        """HASH ``<task>:<field>`` -> value: each background job's run counts and last times (``jobruns``).

        Written by the jobs as each run ends; read by the dispatcher's ``/metrics`` at scrape time.
        """
        return f"{self.prefix}:{{jobs}}:runs"

    def retrain_lock(self, kind: str) -> str:
        """STRING lease token of the running retrain of ``kind`` (router | predictor)."""
        return f"{self.prefix}:{{jobs}}:retrain:{kind}:lock"
