"""Discrete-event simulator of a Chimera pool that runs the product's own policy code.

NOTE(sim): what is simulated and what is real.

- Real: every scheduling decision goes through ``services.policy.ledger.Ledger``, which calls the functions
  the dispatcher calls: the engine choice (``POLICIES[name].select``: Algorithm 1, the baselines, the
  improved rule), workflow affinity (later stages stay on the first stage's engine), the queue order (the
  static aged score the Redis queue sorts by) and the in-flight accounting the paper's L[m] reads (sum of ŷ
  dispatched and not finished); the knobs' defaults are the product's (``services.policy.knobs``). The
  learned router and predictor answers come from ``bench.sweep.workload``.
- Simulated: engine speed (``bench.sweep.engines`` profiles) and outcomes (the workload's outcome model).

Engines do continuous batching as ``services.worker.engine.simulated`` does: every running sequence gains one
token per step of ``profile.step_time_ms(batch)``; admitting a sequence stalls the engine for its prefill
(``prefill_ms_per_token`` * prompt tokens, the history of earlier stages included: the role prompt comes
first, so no prefix is shared with the previous stage's cache). Requests wait in the engine's queue, lowest
score first, arrival breaking ties; the head is admitted while fewer than ``max_num_seqs`` sequences run and
its prompt fits in the free KV cache (tokens). When the cache fills during decoding, the lowest-priority
running sequence is preempted and re-queued with its score; on re-admission it re-prefills its prompt and the
tokens it had generated (vLLM's recompute preemption), then finishes its remaining tokens. Between two events
the batch is constant, so the simulator advances a per-engine token clock instead of stepping: each event
costs O(log n), however long the run.

Workflows arrive as a Poisson process (seeded); stage i+1 is sent the moment stage i finishes.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from bench.sweep.workload import Job
from services.common.types import EngineProfile
from services.policy.contract import JobSize, Policy, PriorityInput
from services.policy.knobs import DEFAULT_KNOBS, Knobs
from services.policy.ledger import Ledger
from services.policy.registry import POLICIES

ROUTERS = ("learned", "prior", "oracle", "none")


@dataclass(frozen=True, slots=True)
class Variant:
    """A policy from the registry plus what feeds it."""

    name: str
    policy: str  # key of services.policy.registry.POLICIES
    router: str  # learned | prior | oracle | none
    # What the queue score is fed instead of the policy's own input (None: its own). An oracle-fed variant
    # stands for a perfect predictor, so its in-flight accounting reads the oracle too (routing).
    priority_input: PriorityInput | None = None
    uses_tau: bool = False


VARIANTS: Mapping[str, Variant] = {
    v.name: v
    for v in (
        Variant("vllm", "vllm", "none"),
        Variant("mlfq", "mlfq", "none"),
        Variant("ltr", "ltr", "none"),
        Variant("vllm-stjf", "vllm-stjf", "none"),
        Variant("stjf-learned", "vllm-stjf", "none", PriorityInput.PREDICTED_TOTAL),
        Variant("chimera", "chimera", "learned", uses_tau=True),
        Variant("chimera-plus", "chimera-plus", "learned", uses_tau=True),
        Variant("chimera-norouter", "chimera", "prior", uses_tau=True),
        Variant("chimera-oracle-router", "chimera", "oracle", uses_tau=True),
        Variant("chimera-oracle-predictor", "chimera", "learned", PriorityInput.ORACLE_TOTAL, True),
    )
}


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One simulated engine: the profile the policies read, and the limits the engine enforces."""

    profile: EngineProfile
    kv_tokens: int  # KV cache capacity in tokens
    max_num_seqs: int = 256


@dataclass(frozen=True, slots=True)
class SimConfig:
    pool: tuple[str, ...]  # model keys, one engine each
    rps: float
    variant: str
    tau: float = DEFAULT_KNOBS.tau
    delta_s: float = DEFAULT_KNOBS.delta_s
    aging_rate: float = DEFAULT_KNOBS.aging_rate  # tokens per second of waiting
    priority_cap: int = DEFAULT_KNOBS.priority_cap_tokens
    seed: int = 0
    fair_cap: int = DEFAULT_KNOBS.fair_cap_tokens

    def knobs(self) -> Knobs:
        return Knobs(self.tau, self.delta_s, self.aging_rate, self.priority_cap, self.fair_cap)


@dataclass(frozen=True, slots=True)
class WorkflowResult:
    job: int
    model: str
    arrival_s: float
    e2e_s: float
    tokens: int
    score: float
    queue_s: tuple[float, ...]  # per stage


@dataclass(frozen=True, slots=True)
class SimResult:
    config: SimConfig
    workflows: tuple[WorkflowResult, ...]
    select_calls: int
    priority_calls: int
    preemptions: int


@dataclass
class _Req:
    job: Job
    model: str
    engine: str
    stage: int
    t_enq: float
    arrival_s: float
    queue_s: list[float]
    score: float = 0.0
    done_tokens: int = 0  # generated before a preemption (re-prefilled, not re-generated)
    start: float = 0.0  # engine token counter at admission
    kv_base: int = 0  # KV tokens it held at admission (prompt plus done_tokens)

    @property
    def request_id(self) -> str:
        return f"{self.job.index}:{self.stage}"


@dataclass
class _Engine:
    """The engine's clock, batch and KV cache; its queue and accounting live in the ``Ledger``."""

    engine_id: str
    model: str
    spec: EngineSpec
    step: list[float]  # step time (ms) per batch size, 0..max_num_seqs
    running: list[tuple[float, int, _Req]] = field(default_factory=list)  # (finish counter, seq, req)
    counter: float = 0.0  # tokens each running sequence has gained since the engine started
    kv_offset: float = 0.0  # sum over running of (kv_base - start): KV in use = kv_offset + b * counter
    stall_ms: float = 0.0  # prefill still to run before decoding resumes
    last_s: float = 0.0
    version: int = 0  # bumped on every change, so stale events are skipped

    def advance(self, now: float) -> None:
        dt = (now - self.last_s) * 1000.0
        self.last_s = now
        if not self.running:
            self.stall_ms = max(0.0, self.stall_ms - dt)
            return
        used = min(self.stall_ms, dt)
        self.stall_ms -= used
        self.counter += (dt - used) / self.step[len(self.running)]

    def kv_used(self) -> float:
        return self.kv_offset + len(self.running) * self.counter

    def next_event(self, now: float) -> tuple[float, str]:
        """When the next sequence finishes, or the KV cache fills first."""
        b = len(self.running)
        target, kind = self.running[0][0], "finish"
        full = (self.spec.kv_tokens - self.kv_offset) / b
        # A lone sequence longer than the cache cannot be helped by preemption: it runs on (vLLM would refuse
        # it; the 30k-token cap fits every derived cache but the 14B's, whose outputs never run away).
        if b > 1 and full < target:
            target, kind = max(self.counter, full), "kvfull"
        need = max(0.0, target - self.counter)
        return now + (self.stall_ms + need * self.step[b]) / 1000.0, kind


def _engines(pool: Sequence[str], specs: Mapping[str, EngineSpec]) -> list[_Engine]:
    out = []
    for m in pool:
        sp = specs[m]
        steps = [sp.profile.step_time_ms(max(1, b)) for b in range(sp.max_num_seqs + 1)]
        out.append(_Engine(engine_id=m, model=m, spec=sp, step=steps))
    return out


def _confidence(job: Job, router: str) -> Mapping[str, float]:
    return {"learned": job.q_learned, "prior": job.q_prior, "oracle": job.q_oracle}.get(router, {})


def _size(job: Job, model: str, stage: int) -> JobSize:
    """Every size the simulator knows of one stage: the learned ones, the attained service and the truth."""
    stages = job.runs[model].stages
    st = stages[stage]
    return JobSize(
        predicted_total=st.pred_total,
        attained=sum(s.output_tokens for s in stages[:stage]),
        per_stage=st.pred_stage,
        oracle_total=st.true_remaining,
    )


def _fed(policy: Policy, variant: Variant) -> Policy:
    if variant.priority_input is None:
        return policy
    return dataclasses.replace(policy, priority_input=variant.priority_input)


class _Sim:
    """One run's mutable state; ``simulate`` is the only way in."""

    def __init__(
        self,
        config: SimConfig,
        specs: Mapping[str, EngineSpec],
        policies: Mapping[str, Policy],
        tenant_of: Callable[[Job], tuple[str, int]] | None = None,
        pin_of: Callable[[Job], str | None] | None = None,
    ) -> None:
        self.config = config
        self.tenant_of = tenant_of or (lambda job: ("", 1))  # (tenant, weight); "" without tenants
        # The model a job's request names (the front door's ``model`` field), as the dispatcher honours it.
        self.pin_of = pin_of or (lambda job: None)
        self.knobs = config.knobs()
        self.variant = VARIANTS[config.variant]
        self.policy = _fed(policies[self.variant.policy], self.variant)
        self.engines = _engines(config.pool, specs)
        self.by_id = {e.engine_id: e for e in self.engines}
        self.ledger = Ledger([(e.engine_id, e.model, e.spec.profile) for e in self.engines])
        self.waiting: dict[str, _Req] = {}  # queued in the ledger, by request id
        self.seq = itertools.count()
        self.arrivals: list[tuple[float, int, Job]] = []
        self.events: list[tuple[float, int, str, int, int]] = []  # (time, seq, kind, engine index, version)
        self.results: list[WorkflowResult] = []
        self.select_calls = self.priority_calls = self.preemptions = 0

    def schedule(self, e: _Engine, now: float) -> None:
        e.version += 1
        if e.running:
            at, kind = e.next_event(now)
            heapq.heappush(self.events, (at, next(self.seq), kind, self.engines.index(e), e.version))

    def admit(self, e: _Engine, now: float) -> None:
        while (head := self.ledger.head(e.engine_id)) is not None and len(e.running) < e.spec.max_num_seqs:
            req = self.waiting[head]
            st = req.job.runs[req.model].stages[req.stage]
            kv = st.prompt_tokens + req.done_tokens
            # The head waits for room (no skipping), unless the engine is empty: it must run somewhere.
            if e.running and e.kv_used() + kv + 1 > e.spec.kv_tokens:
                break
            self.ledger.claim(e.engine_id)
            del self.waiting[head]
            if req.done_tokens:
                req.queue_s[-1] += now - req.t_enq
            else:
                req.queue_s.append(now - req.t_enq)
            e.stall_ms += kv * e.spec.profile.prefill_ms_per_token
            req.start, req.kv_base = e.counter, kv
            e.kv_offset += kv - e.counter
            heapq.heappush(e.running, (e.counter + st.output_tokens - req.done_tokens, next(self.seq), req))

    def dispatch(self, job: Job, stage: int, arrival_s: float, queue_s: list[float], now: float) -> _Req:
        """One stage request through the ledger: the decision the dispatcher makes for it."""
        self.priority_calls += 1
        self.select_calls += stage == 0
        placed = self.ledger.dispatch(
            self.policy,
            self.knobs,
            str(job.index),
            f"{job.index}:{stage}",
            stage,
            lambda model: _size(job, model, stage),
            _confidence(job, self.variant.router) if stage == 0 else {},
            now,
            self.pin_of(job),
            *self.tenant_of(job),
        )
        route = placed.route
        req = _Req(job, route.model, route.engine_id, stage, now, arrival_s, queue_s, placed.score)
        self.waiting[req.request_id] = req
        return req

    def preempt(self, e: _Engine, now: float) -> None:
        """Evict the lowest-priority running sequence (latest arrival among equals), as vLLM does."""
        i = max(range(len(e.running)), key=lambda k: (e.running[k][2].score, e.running[k][2].t_enq))
        _, _, victim = e.running.pop(i)
        heapq.heapify(e.running)
        e.kv_offset -= victim.kv_base - victim.start
        victim.done_tokens += int(e.counter - victim.start)
        victim.t_enq = now
        self.ledger.requeue(e.engine_id, victim.request_id, now)
        self.waiting[victim.request_id] = victim
        self.preemptions += 1

    def arrive(self, job: Job, now: float) -> None:
        for e in self.engines:
            e.advance(now)
        req = self.dispatch(job, 0, now, [], now)
        e = self.by_id[req.engine]
        self.admit(e, now)
        self.schedule(e, now)

    def engine_event(self, e: _Engine, kind: str, now: float) -> None:
        e.advance(now)
        if kind == "kvfull" and len(e.running) > 1:
            self.preempt(e, now)
        while e.running and e.running[0][0] <= e.counter + 1e-9:
            _, _, done = heapq.heappop(e.running)
            e.kv_offset -= done.kv_base - done.start
            self.ledger.complete(e.engine_id, done.request_id)
            run = done.job.runs[done.model]
            if done.stage + 1 < len(run.stages):
                # Affinity keeps the next stage on this engine (the ledger follows the program's assignment).
                self.dispatch(done.job, done.stage + 1, done.arrival_s, done.queue_s, now)
                continue
            self.results.append(
                WorkflowResult(
                    done.job.index,
                    done.model,
                    done.arrival_s,
                    now - done.arrival_s,
                    run.total_tokens,
                    run.score,
                    tuple(done.queue_s),
                )
            )
        self.admit(e, now)
        self.schedule(e, now)

    def run(self, jobs: Sequence[Job], arrivals_s: Sequence[float] | None = None) -> SimResult:
        rng = random.Random(self.config.seed)
        t = 0.0
        for i, job in enumerate(jobs):
            t = arrivals_s[i] if arrivals_s is not None else t + rng.expovariate(self.config.rps)
            self.arrivals.append((t, next(self.seq), job))
        self.arrivals.reverse()  # pop() from the end is the earliest
        while self.arrivals or self.events:
            if self.events and (not self.arrivals or self.events[0][0] < self.arrivals[-1][0]):
                now, _, kind, idx, version = heapq.heappop(self.events)
                e = self.engines[idx]
                if version == e.version:
                    self.engine_event(e, kind, now)
            else:
                now, _, job = self.arrivals.pop()
                self.arrive(job, now)
        self.results.sort(key=lambda r: r.job)
        return SimResult(
            self.config, tuple(self.results), self.select_calls, self.priority_calls, self.preemptions
        )


def simulate(
    jobs: Sequence[Job],
    config: SimConfig,
    specs: Mapping[str, EngineSpec],
    policies: Mapping[str, Policy] = POLICIES,
    tenant_of: Callable[[Job], tuple[str, int]] | None = None,
    arrivals_s: Sequence[float] | None = None,
    pin_of: Callable[[Job], str | None] | None = None,
) -> SimResult:
    """Run ``jobs`` arriving at ``config.rps`` through the pool; every workflow runs to completion.

    ``policies`` is the product's registry; a test may pass a wrapped copy to count the calls.
    ``tenant_of``: each job's (tenant, fair-share weight), for the fairness benchmark; ``arrivals_s``: the
    jobs' arrival times (sorted) instead of a Poisson process at ``config.rps``; ``pin_of``: the model each
    job is pinned to (None: the policy chooses), as a request naming a model is in the live stack.
    """
    return _Sim(config, specs, policies, tenant_of, pin_of).run(jobs, arrivals_s)


@dataclass(frozen=True, slots=True)
class Summary:
    """The numbers frontier.json reports for one run."""

    latency_per_token_ms: float  # mean over workflows of E2E / output tokens
    latency_per_token_ratio_ms: float  # total E2E / total tokens (less sensitive to tiny outputs)
    e2e_mean_s: float
    e2e_p99_s: float
    queue_mean_s: float  # per stage request
    score: float
    share: Mapping[str, float]  # share of workflows per model
    queue_by_model_s: Mapping[str, float]
    workflows: int


def summarize(res: SimResult) -> Summary:
    wf = res.workflows
    if not wf:
        raise ValueError("no workflow finished")
    e2e = sorted(w.e2e_s for w in wf)
    queues = [q for w in wf for q in w.queue_s]
    models = sorted({w.model for w in wf})
    by_model = {m: [q for w in wf if w.model == m for q in w.queue_s] for m in models}
    return Summary(
        latency_per_token_ms=sum(1000 * w.e2e_s / max(1, w.tokens) for w in wf) / len(wf),
        latency_per_token_ratio_ms=1000 * sum(e2e) / max(1, sum(w.tokens for w in wf)),
        e2e_mean_s=sum(e2e) / len(e2e),
        e2e_p99_s=e2e[min(len(e2e) - 1, math.ceil(0.99 * len(e2e)) - 1)],
        queue_mean_s=sum(queues) / len(queues),
        score=sum(w.score for w in wf) / len(wf),
        share={m: sum(w.model == m for w in wf) / len(wf) for m in models},
        queue_by_model_s={m: sum(v) / len(v) for m, v in by_model.items() if v},
        workflows=len(wf),
    )
