"""``explain``: why a request went to its model, and why it sits where it does in that engine's queue.

Both answers come from the decision record the dispatcher stored in the request's hash (field ``decision``)
at dispatch time, plus the queue as it is now. For the paper's rule (engines compared by L[m]), ``recheck``
re-runs Algorithm 1's tests on the recorded q[m] and L[m], so an explanation that disagrees with the
decision it explains is flagged, not trusted; other rules are shown as recorded.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from redis.asyncio import Redis

from services.common.keys import Keys, RequestField
from services.inspect.queue_view import WaitingRequest, effective_priority, engine_ids, waiting_requests

# The policy's own tolerance for boundary ties (L == bound, q == q_fast + delta_s).
_EPS = 1e-12
# The cost name of a selection made by Algorithm 1 on the paper's L[m]: the only one ``recheck`` re-derives.
ALGORITHM1_COST = "load_ms"
COST_LABELS = {"load_ms": "L (ms)", "completion_ms": "completion (ms)", "vllm_score": "4·waiting + running"}


class RequestNotFound(LookupError):
    """No engine holds a request with this id (never dispatched, or its retention passed)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    engine: str
    model: str
    q: float
    cost: float  # what the policy compared engines by (Explanation.cost_name)
    slack_ok: bool | None  # cost <= (1 + tau) * cost_fast; None: the policy has no such test
    margin_ok: bool | None  # q >= q_fast + margin; None: the policy has no such test
    fastest: bool
    chosen: bool


@dataclass(frozen=True, slots=True)
class Recheck:
    engine: str  # what Algorithm 1 picks from the recorded numbers
    fast_engine: str
    slack_bound_ms: float
    margin_needed: float
    consistent: bool  # same engine and the same test outcomes as recorded


@dataclass(frozen=True, slots=True)
class Explanation:
    request_id: str
    engine: str
    model: str
    program_id: str
    workflow: str
    stage: int
    identity: str  # how the door found its program (IdentitySource); "" in records that predate it
    state: str
    attempt: int
    policy: str
    branch: str  # new | pinned | reuse | reuse-race
    candidates: tuple[Candidate, ...]  # the policy's scan; empty unless branch new/pinned
    cost_name: str  # what Candidate.cost holds: load_ms (L[m]), completion_ms, vllm_score
    loads_ms: Mapping[str, float]  # every engine's L[m] when the request was dispatched
    tau: float
    delta_s: float
    recheck: Recheck | None  # only for Algorithm 1 on L[m]
    brownout: Mapping[str, Any] | None  # from, to, max_queue_s, margin: the chosen engine was full
    moved: Mapping[str, Any] | None  # from, to, margin: the program's engine was dead
    escalation: Mapping[str, Any] | None  # weighed after a failed tool result (EscalationCheck's record)
    degraded: tuple[str, ...]
    predicted_tokens: int
    predicted_tokens_p90: int
    score: float
    aging_rate: float
    priority_cap_tokens: int
    t_enq: float
    age_s: float
    effective_priority: float
    position: int | None  # 0 is served next; None unless still waiting
    waiting_total: int
    ahead: tuple[WaitingRequest, ...]  # the requests ahead of it (the first few)
    timings_ms: Mapping[str, float]
    reasons: tuple[str, ...]


def _num(x: Any, default: float = 0.0) -> float:
    try:
        return float(x)  # the record writes inf as the string 'inf'
    except (TypeError, ValueError):
        return default


def recheck(candidates: Sequence[Candidate], tau: float, delta_s: float, recorded_engine: str) -> Recheck:
    """Algorithm 1 (``services.policy.chimera.select_engine``) over the recorded q and L.

    ``candidates`` are in the recorded scan order (descending q, then load); the recorded fastest engine is
    kept because its tie-break (decode speed) is not in the record, but it must have the least load.
    """
    fast = next((c for c in candidates if c.fastest), None) or min(candidates, key=lambda c: c.cost)
    bound = fast.cost * (1.0 + tau) if fast.cost > 0 else 0.0
    need = fast.q + delta_s
    tests = [(c.cost <= bound + _EPS, c.q >= need - _EPS) for c in candidates]
    winner = next((c for c, (slack, margin) in zip(candidates, tests, strict=True) if slack and margin), fast)
    consistent = (
        fast.cost <= min(c.cost for c in candidates) + _EPS
        and all(t == (c.slack_ok, c.margin_ok) for c, t in zip(candidates, tests, strict=True))
        and winner.engine == recorded_engine
    )
    return Recheck(winner.engine, fast.engine, bound, need, consistent)


def candidates_from_record(selection: Mapping[str, Any]) -> tuple[Candidate, ...]:
    """The policy's scan as the decision record (``Selection.to_record``) stored it."""
    fast, chosen = selection.get("fast_engine"), selection.get("engine")
    return tuple(
        Candidate(
            engine=str(c["engine"]),
            model=str(c["model"]),
            q=_num(c["q"]),
            cost=_num(c["cost"]),
            slack_ok=_test(c.get("slack_ok")),
            margin_ok=_test(c.get("margin_ok")),
            fastest=c["engine"] == fast,
            chosen=c["engine"] == chosen,
        )
        for c in selection.get("candidates", ())
    )


def _test(x: Any) -> bool | None:
    return None if x is None else bool(x)


# How a program was found, for the sentence (``services.dispatcher.intake.IdentitySource``'s values).
_FOUND_BY = {
    "header": "the client's X-Chimera-Program-Id (or the gRPC program_id)",
    "metadata": "the client's metadata.program_id",
    "session": "the session id its agent client sends (a session header or prompt_cache_key)",
    "continuation": "conversation continuation: its messages begin with an earlier stage's and its answer",
    "new": "none of the client's ids: a new program",
}


def reasons(e: Explanation) -> tuple[str, ...]:
    """The explanation in sentences, for people (pure)."""
    out: list[str] = []
    if e.identity in _FOUND_BY:
        out.append(f"program {e.program_id} was found by {_FOUND_BY[e.identity]}")
    if e.branch in ("reuse", "reuse-race"):
        out.append(
            f"stage {e.stage} of program {e.program_id} stays on {e.engine} ({e.model}), the engine its "
            "first stage was assigned to: the workflow's context lives there (affinity)"
        )
    elif e.recheck is not None:
        fast = next(c for c in e.candidates if c.fastest)
        chosen = next(c for c in e.candidates if c.chosen)
        if e.branch == "pinned":
            out.append(f"the client pinned model {e.model}; only its engines were candidates")
        if chosen.engine != fast.engine:
            out.append(
                f"{chosen.engine} ({chosen.model}) left the least-loaded {fast.engine}: its confidence "
                f"q={chosen.q:.3f} >= q_fast + delta_s = {e.recheck.margin_needed:.3f}, and its load "
                f"L={chosen.cost:.1f} ms <= (1 + tau) * L_fast = {e.recheck.slack_bound_ms:.1f} ms"
            )
        else:
            out.append(
                f"{fast.engine} ({fast.model}) is the least-loaded engine (L={fast.cost:.1f} ms) and no "
                f"engine passed both the slack test (L <= {e.recheck.slack_bound_ms:.1f} ms) and the margin "
                f"test (q >= {e.recheck.margin_needed:.3f})"
            )
        if not e.recheck.consistent:
            out.append(f"WARNING: re-running the tests on the record picks {e.recheck.engine}")
    elif e.candidates:
        chosen = next(c for c in e.candidates if c.chosen)
        label = COST_LABELS.get(e.cost_name, e.cost_name)
        out.append(
            f"policy {e.policy} chose {chosen.engine} ({chosen.model}) with {label} {chosen.cost:.1f}"
            + ("; it has no slack or margin test" if chosen.slack_ok is None else "")
        )
    if e.moved:
        out.append(
            f"moved: its program's engine {e.moved.get('from')} was not alive, so it went to "
            f"{e.moved.get('to')} (the same model, or one the router scores within {e.moved.get('margin')})"
        )
    if e.escalation:
        out.append(escalation_reason(e.escalation, e.tau, e.delta_s))
    if e.brownout:
        b = e.brownout
        out.append(
            f"browned out: {b.get('from')} held more than its bound of {b.get('max_queue_s')} s of predicted "
            f"work, so the workflow went to {b.get('to')}, whose model the router scores within "
            f"{b.get('margin')} of it"
        )
    for dep in e.degraded:
        out.append(
            "the router failed: every q counted as 0 (fastest engine)"
            if dep == "router"
            else f"the {dep} failed: max_tokens stood in for the prediction"
        )
    if e.position is not None:
        where = (
            "next in line"
            if e.position == 0
            else f"position {e.position} of {e.waiting_total}, behind {e.position} with lower scores"
        )
        out.append(
            f"{where} (score = min(y, {e.priority_cap_tokens}) + {e.aging_rate:g} * t_enq); "
            f"effective priority {e.effective_priority:.1f} = {e.predicted_tokens} predicted tokens - "
            f"{e.aging_rate:g} tok/s * {e.age_s:.1f} s waited"
        )
    else:
        out.append(f"no longer waiting: state {e.state}")
    return tuple(out)


def escalation_reason(x: Mapping[str, Any], tau: float, delta_s: float) -> str:
    """The sentence of an escalation record (``services.policy.escalation.Escalation.to_record``)."""
    head = (
        f"the last tool result failed on {x.get('from')} (q={_num(x.get('confidence')):.3f}; staying costs "
        f"{_num(x.get('stay_ms')):.0f} ms)"
    )
    checks = list(x.get("checks") or ())
    chosen = next((c for c in checks if c.get("engine") == x.get("to")), None)
    if chosen is not None:
        q, move, prefix = (_num(chosen[k]) for k in ("confidence", "move_ms", "prefix_ms"))
        return (
            f"{head}, so it escalated to {chosen['engine']} ({chosen['model']}): q={q:.3f} is at least "
            f"delta_s={delta_s:g} above, and its cost {move:.0f} ms (with {prefix:.0f} ms to prefill the "
            f"{x.get('prefix_tokens')}-token history again) is within (1 + {_num(x.get('slack'), tau):g}) of "
            "staying"
        )
    why = [
        f"{c.get('engine')} " + ("is over the slack" if c.get("stronger") else "is not stronger by delta_s")
        for c in checks
    ]
    return f"{head}; it stays: " + ("; ".join(why) if why else "no engine of another rated model is alive")


async def _find_engine(redis: Redis, keys: Keys, request_id: str) -> str:
    engines = await engine_ids(redis, keys)
    pipe = redis.pipeline(transaction=False)
    for eng in engines:
        pipe.exists(keys.request(eng, request_id))
    found = [eng for eng, n in zip(engines, await pipe.execute(), strict=True) if n]
    if not found:
        raise RequestNotFound(f"no engine holds request {request_id!r}")
    return found[0]


async def explain(
    redis: Redis, keys: Keys, request_id: str, *, ahead_limit: int = 10, now: float | None = None
) -> Explanation:
    """Explain one request from its decision record and the queue as it is now."""
    t = time.time() if now is None else now
    engine = await _find_engine(redis, keys, request_id)
    h = cast(dict[str, str], await redis.hgetall(keys.request(engine, request_id)))  # decoded by the client
    f = RequestField
    d: dict[str, Any] = json.loads(h.get(f.DECISION) or "{}")
    payload: dict[str, Any] = json.loads(h.get(f.PAYLOAD) or "{}")
    selection = d.get("selection") or {}
    candidates = candidates_from_record(selection)
    tau, delta_s = _num(d.get("tau"), math.nan), _num(d.get("delta_s"), math.nan)
    score, aging = _num(h.get(f.SCORE)), _num(d.get("aging_rate"))
    t_enq = _num(h.get(f.T_ENQ), t)
    state = h.get(f.STATE, "")
    found = await redis.zrank(keys.queue(engine), request_id) if state == "queued" else None
    rank = int(found) if isinstance(found, int) else None
    ahead = (
        await waiting_requests(redis, keys, engine, max(0, rank - ahead_limit), rank - 1, t) if rank else ()
    )
    e = Explanation(
        request_id=request_id,
        engine=engine,
        model=str(d.get("model", "")),
        program_id=h.get(f.PROGRAM_ID, str(payload.get("program_id", ""))),
        workflow=str(payload.get("workflow", "")),
        stage=int(payload.get("stage", 0)),
        identity=str(d.get("identity", "")),
        state=state,
        attempt=int(_num(h.get(f.ATTEMPT))),
        policy=str(d.get("policy", "")),
        branch=str(d.get("branch", "")),
        candidates=candidates,
        cost_name=str(selection.get("cost_name", "")),
        loads_ms={str(k): _num(v) for k, v in (d.get("loads_ms") or {}).items()},
        tau=tau,
        delta_s=delta_s,
        recheck=recheck(candidates, tau, delta_s, str(selection.get("engine", engine)))
        if candidates and selection.get("cost_name") == ALGORITHM1_COST
        else None,
        brownout=d.get("brownout"),
        moved=d.get("moved"),
        escalation=d.get("escalation"),
        degraded=tuple(str(x) for x in d.get("degraded", ())),
        predicted_tokens=int(_num(h.get(f.Y))),
        predicted_tokens_p90=int(_num(h.get(f.Y90))),
        score=score,
        aging_rate=aging,
        priority_cap_tokens=int(_num(d.get("priority_cap_tokens"))),
        t_enq=t_enq,
        age_s=max(0.0, t - t_enq),
        effective_priority=effective_priority(score, aging, t),
        position=rank,
        waiting_total=int(await redis.zcard(keys.queue(engine))),
        ahead=ahead,
        timings_ms={str(k): _num(v) for k, v in (d.get("timings_ms") or {}).items()},
        reasons=(),
    )
    return replace(e, reasons=reasons(e))
