"""Baseline policies (paper §8) and an improved selection rule, as pure functions beside Chimera's.

Every function here has the signature of ``policy.SelectFn`` or ``policy.PriorityFn`` so that the dispatcher
and the benchmark simulator (``bench/sim.py``) run them through the same ``POLICIES`` registry.

NOTE(baselines): what each baseline needs from its caller is the ``predicted_tokens`` argument of the priority
function; the registry cannot change what the caller feeds it, so each entry states what that number must be:

- ``vllm``: vLLM's data-parallel balancer (lowest ``4 * waiting + running``) and FCFS in every engine. The
  confidences, tau and delta_s are ignored: on a heterogeneous pool the model is chosen by load alone.
- ``vllm-stjf``: the same balancer; priority is the *true* remaining workflow tokens (an oracle reference,
  not a competitor). Fed the oracle it is the paper's vLLM(STJF); fed the predictor it is a learned STJF.
- ``ltr``: the same balancer; shortest job first on a per-request output-length estimate. The paper's OPT
  ranker (Fu et al. 2024) is replaced by the product's length predictor trained on *per-stage* targets (each
  stage its own job, no workflow awareness): the caller feeds that per-stage estimate. Only the simulator
  has that predictor; the live dispatcher feeds its remaining-workflow ŷ, so a live ``ltr`` is a learned STJF.
- ``mlfq``: the same balancer; FastServe-style multi-level feedback queue by *attained service*. The caller
  feeds the tokens the workflow has already generated in its earlier stages (program-level attained service,
  as Autellix does): the dispatcher reads the program table's ``attained`` (``Policy.priority_input``), which
  the front door credits as it relays each stage's final answer. Levels and quanta:
  ``MLFQ_LEVEL_FLOORS`` = 0 | 256 | 1024 | 4096 tokens (x4 quanta: 256, 768, 3072, then the last level),
  FCFS within a level, and promotion by waiting time through the same linear aging as Chimera's queue. Queues
  are non-preemptive (a stage, once running, finishes), as every policy here: the engine's batch is not
  re-ordered.
- ``chimera-plus``: the improved rule (``plus_select``: completion-time cost, a margin priced by the
  candidate's occupancy), with Chimera's priority.

The registry entries live in ``policy.POLICIES``.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from services.common.types import EngineSnapshot
from services.dispatcher.errors import NoLiveEngine

if TYPE_CHECKING:
    from services.dispatcher.policy import Selection

# ``policy`` imports this module to register these functions in ``POLICIES``, so the names this module needs
# from ``policy`` are imported inside the functions (at call time both modules are complete).

# vLLM's DP load balancer score weight on waiting requests (vllm/v1/engine/core_client.py, paper §8 [S]).
VLLM_WAITING_WEIGHT = 4
MLFQ_LEVEL_FLOORS: tuple[int, ...] = (0, 256, 1024, 4096)
# chimera-plus defaults, both properties of the workload rather than of any policy:
# - a nominal new workflow, in output tokens: about the workload's mean total output (paper §5: 447-709);
# - prompt tokens prefilled per output token: a stage's prompt (role prompt, task, the history so far) is
#   about twice its output in the workload (measured per model in bench/results/README.md, 533-960 prompt vs
#   194-685 output tokens per stage), and every one of those prefill tokens takes the GPU from the batch.
PLUS_NOMINAL_TOKENS = 600
PLUS_PREFILL_PER_TOKEN = 2.0


def _alive(engines: Sequence[EngineSnapshot]) -> list[EngineSnapshot]:
    alive = [e for e in engines if e.alive]
    if not alive:
        raise NoLiveEngine("no live engine is registered")
    return alive


def vllm_score(e: EngineSnapshot) -> int:
    """vLLM's balancer score: waiting requests weigh four times a running one."""
    return VLLM_WAITING_WEIGHT * e.queued + e.running


def vllm_select(
    engines: Sequence[EngineSnapshot], confidence: Mapping[str, float], tau: float, delta_s: float
) -> Selection:
    """vLLM: the engine with the lowest ``4 * waiting + running``; confidences and slack are ignored.

    Ties go to the engine with less in-flight work, then the faster engine, then the id: deterministic.
    """
    from services.dispatcher.policy import CandidateCheck, Selection, engine_load_ms

    alive = _alive(engines)
    pick = min(
        alive,
        key=lambda e: (vllm_score(e), e.inflight_tokens, e.profile.decode_ms_per_token, e.engine_id),
    )
    checks = tuple(
        CandidateCheck(
            engine_id=e.engine_id,
            model=e.model,
            q=float(confidence.get(e.model, 0.0)),
            load_ms=engine_load_ms(e),
            slack_ok=e.engine_id == pick.engine_id,
            margin_ok=True,
        )
        for e in sorted(alive, key=lambda e: (vllm_score(e), e.engine_id))
    )
    return Selection(pick.engine_id, pick.model, pick.engine_id, checks, tau, delta_s)


def fcfs_priority(predicted_tokens: int, enqueued_unix: float, aging_rate: float, cap: int) -> float:
    """FCFS: arrival time alone (the prediction is ignored; nothing can starve)."""
    return enqueued_unix


def mlfq_level(attained_tokens: int, floors: Sequence[int] = MLFQ_LEVEL_FLOORS) -> int:
    """The MLFQ level (0 = highest) of a job that has already received ``attained_tokens`` of service."""
    return max(0, bisect.bisect_right(list(floors), max(0, attained_tokens)) - 1)


def mlfq_priority(predicted_tokens: int, enqueued_unix: float, aging_rate: float, cap: int) -> float:
    """MLFQ queue score: the level's floor in tokens, aged like Chimera's (``priority_score``).

    ``predicted_tokens`` is, for this policy, the workflow's *attained* service (tokens its earlier stages
    generated): the registry fixes the argument's name, the caller decides what it holds (module docstring).

    Within a level every job has the same floor, so the order is FCFS; a job one level down sorts behind
    the level above until it has waited ``(floor_k - floor_{k-1}) / aging_rate`` seconds longer (promotion).
    """
    from services.dispatcher.policy import priority_score

    floor = MLFQ_LEVEL_FLOORS[mlfq_level(predicted_tokens)]
    return priority_score(floor, enqueued_unix, aging_rate, cap)


def effective_step_ms(e: EngineSnapshot, batch: int, prefill_per_token: float) -> float:
    """Time per decode step at ``batch`` sequences, counting the prefill their stages bring along."""
    p = e.profile
    return p.step_time_ms(batch) + batch * prefill_per_token * p.prefill_ms_per_token


def completion_ms(
    e: EngineSnapshot,
    nominal_tokens: int = PLUS_NOMINAL_TOKENS,
    prefill_per_token: float = PLUS_PREFILL_PER_TOKEN,
) -> float:
    """Predicted completion time of a new nominal workflow on ``e``: its own decode at the batch it joins,
    plus the queued work ahead of it drained at full-batch throughput, both with their share of prefill.

    Why not the paper's L[m]: (1) it prices every token at ``decode_ms_per_token / max_batch_size``, as if
    the engine always ran a full batch at single-stream step time, so an engine with a few sequences looks
    nearly free while each of them decodes at single-stream speed, and a full one looks cheaper than it is;
    (2) it ignores prefill, and stages re-prefill a growing history (about two prompt tokens per output
    token here), which on a 7B-14B model costs as much GPU time as decoding; (3) running work already holds
    its slots, so only the *queued* share of the in-flight ŷ delays a newcomer, which keeps one heavy-tailed
    ŷ from inflating an engine's load; (4) the result is never 0, so the relative slack still compares
    models on an idle pool, where L_fast = 0 lets no strong model in.
    """
    cap = max(1, e.profile.max_batch_size)
    n = max(0, e.queued) + max(0, e.running)
    own = nominal_tokens * effective_step_ms(e, min(cap, n + 1), prefill_per_token)
    per_token = effective_step_ms(e, cap, prefill_per_token) / cap
    queued_share = max(0, e.queued) / n if n else 0.0
    return own + e.inflight_tokens * queued_share * per_token


def occupancy(e: EngineSnapshot) -> float:
    """Share of the engine's batch taken (queued work counts: it takes the next free slots), capped at 1."""
    return min(1.0, (max(0, e.queued) + max(0, e.running)) / max(1, e.profile.max_batch_size))


def plus_margin(e: EngineSnapshot, cost_ratio: float, delta_s: float) -> float:
    """Confidence a candidate ``cost_ratio`` times slower than the fastest must add: ``delta_s`` on an idle
    engine, rising with its occupancy to ``delta_s * cost_ratio`` on a full one.

    Why: the margin is the price of the strong engine's capacity. The paper's flat ``delta_s`` spends that
    capacity on whichever workflows arrive while it has slack, and once the engine is full the workflows
    the router expects to gain most find it taken; pricing a full engine by its cost ratio keeps it for
    them. An idle engine's capacity is not scarce, though: a fixed ``delta_s * cost_ratio`` left it idle on a
    light pool, where a strong model is free to use (chimera-plus tied the paper rule there).
    """
    return delta_s * (1.0 + (max(1.0, cost_ratio) - 1.0) * occupancy(e))


def plus_select(
    engines: Sequence[EngineSnapshot], confidence: Mapping[str, float], tau: float, delta_s: float
) -> Selection:
    """Algorithm 1's scan (descending q; first within the slack and above the margin) on ``completion_ms``
    instead of L[m], with a margin priced by the candidate's scarcity (``plus_margin``). ``load_ms`` in the
    record is the completion estimate."""
    from services.dispatcher.policy import _EPS, CandidateCheck, Selection

    if tau < 0 or delta_s < 0:
        raise ValueError("tau and delta_s must be >= 0")
    alive = _alive(engines)
    cost = {e.engine_id: completion_ms(e) for e in alive}
    q = {e.engine_id: float(confidence.get(e.model, 0.0)) for e in alive}
    fast = min(alive, key=lambda e: (cost[e.engine_id], e.engine_id))
    c_fast, q_fast = cost[fast.engine_id], q[fast.engine_id]
    bound = c_fast * (1.0 + tau)
    order = sorted(alive, key=lambda e: (-q[e.engine_id], cost[e.engine_id], e.engine_id))
    checks = tuple(
        CandidateCheck(
            engine_id=e.engine_id,
            model=e.model,
            q=q[e.engine_id],
            load_ms=cost[e.engine_id],
            slack_ok=cost[e.engine_id] <= bound + _EPS,
            margin_ok=q[e.engine_id] >= q_fast + plus_margin(e, cost[e.engine_id] / c_fast, delta_s) - _EPS,
        )
        for e in order
    )
    chosen = next((c for c in checks if c.slack_ok and c.margin_ok), None)
    pick = chosen.engine_id if chosen else fast.engine_id
    model = chosen.model if chosen else fast.model
    return Selection(pick, model, fast.engine_id, checks, tau, delta_s)
