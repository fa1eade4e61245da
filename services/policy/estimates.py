"""What an engine costs a newcomer, estimated from its snapshot: the paper's load L[m] and a completion time.

Both are pure functions of ``EngineSnapshot`` (measured profile, in-flight predicted tokens, queue and batch
occupancy), shared by every policy that prices engines and by the decision records that explain them.
"""

from __future__ import annotations

from services.common.types import EngineSnapshot

# Defaults of ``completion_ms``, both properties of the workload rather than of any policy:
# - a nominal new workflow, in output tokens: about the workload's mean total output (paper §5: 447-709);
# - prompt tokens prefilled per output token: a stage's prompt (role prompt, task, the history so far) is
#   about twice its output in the workload (measured per model in bench/results/README.md, 533-960 prompt vs
#   194-685 output tokens per stage), and every one of those prefill tokens takes the GPU from the batch.
NOMINAL_WORKFLOW_TOKENS = 600
PREFILL_PER_OUTPUT_TOKEN = 2.0


def engine_load_ms(snapshot: EngineSnapshot) -> float:
    """The paper's TTLT proxy L[m] = P_m * decode_ms_per_token / max_batch_size (§2.4)."""
    return snapshot.inflight_tokens * load_ms_per_token(snapshot)


def load_ms_per_token(snapshot: EngineSnapshot) -> float:
    """What one more predicted token adds to L[m]: a token's share of a full batch's step."""
    profile = snapshot.profile
    return profile.decode_ms_per_token / max(1, profile.max_batch_size)


def effective_step_ms(e: EngineSnapshot, batch: int, prefill_per_token: float) -> float:
    """Time per decode step at ``batch`` sequences, counting the prefill their stages bring along."""
    p = e.profile
    return p.step_time_ms(batch) + batch * prefill_per_token * p.prefill_ms_per_token


def completion_ms(
    e: EngineSnapshot,
    nominal_tokens: int = NOMINAL_WORKFLOW_TOKENS,
    prefill_per_token: float = PREFILL_PER_OUTPUT_TOKEN,
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
