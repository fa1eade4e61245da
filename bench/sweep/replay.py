"""Live replay: the same jobs through the real services, next to the simulator, at a small scale.

NOTE(replay): ``services.launcher.stack.running_stack`` starts Redis, the router, the predictor, one worker
per engine (SIMULATED engines on the derived profiles of ``bench.sweep.engines``, ``time_scale`` times faster
than the profile) and the dispatcher with the policy under test. A client sends each job's stages in order
(``stage_messages``, each stage's answer in the next stage's history) with Poisson arrivals at ``rps *
time_scale``. The simulated worker draws its own output lengths, so every stage asks for exactly the
outcome model's length (``max_tokens``, with the worker's lognormal median set far above any of them); the
lengths of the job's 1.5B run serve on every model, so that length does not depend on the route (the
simulator replica does the same). Scores come from the outcome model for the model that served the job.

The replica runs ``bench.sweep.sim`` on the same jobs with the router and predictor the live stack
bootstrapped (loaded from its artifact folder), so both harnesses make their decisions with the same learned
models. Latencies are reported in profile time (real seconds * ``time_scale``). The default ``time_scale`` is
1: at 2 the five services, two simulated engines and the client could not keep the profiled clock on a 2-core
machine, and the live latencies drifted 17-44% above the replica's (an earlier run, README). Each seed
draws its own jobs and arrivals; the learned models are bootstrapped once (``BOOTSTRAP_SEED``).

The dispatch overhead (Table 1) is real time from each stage's ``dispatch_timings`` (router, predictor, and
the scheduler: the policy and its Redis round trips) over the workflow's real E2E latency; at
``time_scale`` 1 that is the share at the profile's speed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench.common.paths import RESULTS
from bench.sweep.engines import derive_all, measure_shapes
from bench.sweep.replay_report import (
    ORDER_METRICS,
    LiveSummary,
    OrderAgreement,
    PolicyResult,
    ReplayResult,
    SimSummary,
    mean,
    orders,
    table,
)
from bench.sweep.sim import EngineSpec, SimConfig, simulate, summarize
from bench.sweep.workload import Job, Run, Stage, _confidences, _median
from services.common import artifacts
from services.common.types import TraceRow
from services.launcher.config import LauncherSettings
from services.launcher.pool import EngineSpec as PoolEngine
from services.launcher.pool import PoolSpec
from services.launcher.stack import running_stack
from services.workload.corpus import Problem, load_corpus
from services.workload.generate import bindings_for, generate
from services.workload.models import resolve_model
from services.workload.outcome import OutcomeModel
from services.workload.workflows import Workflow, get_workflow, stage_messages, workflows_for

POOL = ("qwen2.5-1.5b", "qwen2.5-7b")
# A runaway stage (up to 30k tokens) would keep one replay running for minutes of real time: stages are
# capped here, in the live run and its simulator replica alike (the dispatcher's default limit is 8192).
MAX_STAGE_TOKENS = 4096
RANKED = (
    ("vllm", 0.0),
    ("mlfq", 0.0),
    ("chimera", 1.0),
    ("chimera", 4.0),
    ("chimera-plus", 1.0),
    ("chimera-plus", 4.0),
)
BOOTSTRAP_SEED = 8


@dataclass(frozen=True, slots=True)
class ReplayJob:
    job: Job  # what the simulator replica runs
    problem: Problem
    workflow: Workflow
    lengths: tuple[int, ...]


def build_jobs(n: int, seed: int, dataset: str) -> list[ReplayJob]:
    corpus = load_corpus()
    by_id = {p.id: p for p in corpus.problems}
    om = OutcomeModel(corpus.problems, models=POOL)
    programs = list(generate(corpus.problems, om, bindings_for(POOL), n, seed, workflows_for(dataset)))
    out = []
    for i in range(0, len(programs), len(POOL)):
        group = programs[i : i + len(POOL)]
        ref = group[0]  # the 1.5B run: its lengths serve on every model
        lengths = tuple(min(MAX_STAGE_TOKENS, t) for t in ref.detail.stage_tokens)
        runs = {}
        for p in group:
            stages = tuple(
                Stage(t.prompt_tokens, lengths[k], 0, 0, sum(lengths[k:])) for k, t in enumerate(ref.traces)
            )
            runs[p.detail.model] = Run(stages, p.detail.score, p.detail.success)
        job = Job(i // len(POOL), ref.outcome.workflow, runs, {}, {}, {})
        problem = by_id[ref.detail.problem_id]
        out.append(ReplayJob(job, problem, get_workflow(ref.outcome.workflow), lengths))
    return out


def with_live_models(jobs: list[ReplayJob], artifact_root: Path) -> list[Job]:
    """The replica's jobs, with the predictions of the router and predictor the live stack serves."""
    _, router = artifacts.load(artifact_root / "router")
    _, predictor = artifacts.load(artifact_root / "predictor")
    name = {k: resolve_model(k).name for k in POOL}
    rows: list[TraceRow] = []
    for rj in jobs:
        history: list[str] = []
        for k in range(rj.workflow.n_stages):
            msgs = stage_messages(rj.workflow, k, rj.problem.text, history)
            for m in POOL:
                rows.append(
                    TraceRow(
                        request_id=f"{rj.job.index}-{k}-{m}",
                        program_id=str(rj.job.index),
                        workflow=rj.workflow.name,
                        stage=k,
                        engine=m,
                        model=name[m],
                        system_text=msgs[0].content,
                        user_text=msgs[1].content,
                        prompt_text="\n".join(x.content for x in msgs),
                        # Only the model, workflow, stage and texts reach the predictor (PredictorInput).
                        prompt_tokens=0,
                        completion_tokens=rj.lengths[k],
                        predicted=0,
                        predicted_p90=0,
                        queue_wait_s=0.0,
                        run_s=0.0,
                        finish_reason="length",
                    )
                )
            history.append("x " * rj.lengths[k])
    preds = iter(_median(predictor, rows).tolist())
    qs = _confidences(router, [rj.problem.text for rj in jobs], [rj.workflow.name for rj in jobs])
    out = []
    for rj, q in zip(jobs, qs, strict=True):
        y = {m: [0] * rj.workflow.n_stages for m in POOL}
        for k in range(rj.workflow.n_stages):
            for m in POOL:
                y[m][k] = next(preds)
        runs = {
            m: dataclasses.replace(
                r, stages=tuple(dataclasses.replace(s, pred_total=y[m][k]) for k, s in enumerate(r.stages))
            )
            for m, r in rj.job.runs.items()
        }
        out.append(dataclasses.replace(rj.job, runs=runs, q_learned=q))
    return out


@dataclass(frozen=True, slots=True)
class JobResult:
    """One workflow through the live stack: real E2E seconds, and its stages' dispatch timings summed."""

    e2e_s: float
    model: str  # the model key (``POOL``) that served its last stage
    dispatch_ms: float
    router_ms: float
    predictor_ms: float
    policy_ms: float
    redis_ms: float


async def _stage(stub: Any, pb: Any, rj: ReplayJob, pid: str, k: int, history: Sequence[str]) -> Any:
    msgs = stage_messages(rj.workflow, k, rj.problem.text, history)
    req = pb.GenerateRequest(
        program_id=pid,
        stage=k,
        workflow=rj.workflow.name,
        messages=[pb.ChatMessage(role=m.role, content=m.content) for m in msgs],
        sampling=pb.SamplingParams(max_tokens=rj.lengths[k], temperature=0.0),
    )
    final = None
    async for resp in stub.Generate(req):
        if resp.HasField("final"):
            final = resp.final
    if final is None:
        raise RuntimeError("stream ended without a final message")
    return final


async def _job(stub: Any, pb: Any, rj: ReplayJob, tag: str) -> JobResult:
    pid = f"replay-{tag}-{rj.job.index}"
    t0 = time.monotonic()
    history: list[str] = []
    dispatch = router = predictor = policy = redis = 0.0
    model = ""
    for k in range(rj.workflow.n_stages):
        final = await _stage(stub, pb, rj, pid, k, history)
        history.append(final.text)
        t = final.dispatch_timings
        dispatch += final.dispatch_ms
        router += t.router_ms
        predictor += t.predictor_ms
        policy += t.policy_ms
        redis += t.redis_ms
        model = resolve_model(final.model).key
    await stub.EndProgram(pb.EndProgramRequest(program_id=pid))
    return JobResult(
        e2e_s=time.monotonic() - t0,
        model=model,
        dispatch_ms=dispatch,
        router_ms=router,
        predictor_ms=predictor,
        policy_ms=policy,
        redis_ms=redis,
    )


async def _drive(addr: str, jobs: list[ReplayJob], rate: float, seed: int, tag: str) -> list[JobResult]:
    from chimera.dispatcher.v1 import dispatcher_pb2 as pb
    from chimera.dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc

    rng = random.Random(seed)
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = pb_grpc.DispatcherStub(channel)
        tasks = []
        for rj in jobs:
            await asyncio.sleep(rng.expovariate(rate))
            tasks.append(asyncio.create_task(_job(stub, pb, rj, tag)))
        return list(await asyncio.gather(*tasks))


def _pool(derived: dict[str, Any], time_scale: float) -> PoolSpec:
    return PoolSpec(
        engines=tuple(
            PoolEngine(
                id=k.replace(".", "_"),
                model=resolve_model(k).name,
                kind="simulated",
                max_num_seqs=derived[k].fit_seqs,
                stand_in=k,
                env={
                    "time_scale": f"{time_scale:g}",
                    "profile_json": derived[k].profile.to_json(),
                    "sim_length_median": "1e9",
                    "sim_length_sigma": "0",
                },
            )
            for k in POOL
        )
    )


def replay_seed(
    n: int, rps: float, time_scale: float, seed: int, dataset: str, state: Path
) -> dict[str, PolicyResult]:
    """One seed: every policy of ``RANKED`` live (a fresh stack each) and in the simulator replica."""
    derived = derive_all(measure_shapes(POOL))
    specs = {k: EngineSpec(d.profile, d.kv_capacity_tokens, d.max_num_seqs) for k, d in derived.items()}
    jobs = build_jobs(n, seed, dataset)
    # The learned models are bootstrapped once per replay (training seed fixed), so seeds vary the jobs only.
    settings = LauncherSettings.ephemeral(
        state, bootstrap_workflows=1000, seed=BOOTSTRAP_SEED, embedded_corpus=False
    )
    pool = _pool(derived, time_scale)
    out: dict[str, PolicyResult] = {}
    replica: list[Job] | None = None
    for policy, tau in RANKED:
        env = {"CHIMERA_DISPATCHER_POLICY": policy, "CHIMERA_DISPATCHER_TAU": f"{tau:g}"}
        with running_stack(settings, pool, dispatcher_env=env) as stack:
            rows = asyncio.run(_drive(stack.dispatcher_addr, jobs, rps * time_scale, seed, policy))
            replica = replica or with_live_models(jobs, state / "artifacts")
        sim = summarize(simulate(replica, SimConfig(POOL, rps, policy, tau=tau, seed=seed), specs))
        out[f"{policy} tau={tau:g}"] = PolicyResult(
            live=_live_summary(rows, jobs, time_scale),
            sim=SimSummary(
                latency_per_token_ms=sim.latency_per_token_ms,
                score=sim.score,
                share_7b=sim.share.get("qwen2.5-7b", 0.0),
            ),
        )
    return out


def replay(
    n: int, rps: float, time_scale: float, seeds: Sequence[int], dataset: str, state: Path, command: str
) -> ReplayResult:
    per_seed = {seed: replay_seed(n, rps, time_scale, seed, dataset, state) for seed in seeds}
    means = mean(list(per_seed.values()))
    agreements = {}
    for metric in ORDER_METRICS:
        live, sim = orders(means, metric)
        seeds_agree = tuple(a == b for a, b in (orders(r, metric) for r in per_seed.values()))
        agreements[metric] = OrderAgreement(live=live, sim=sim, agree=live == sim, seeds_agree=seeds_agree)
    return ReplayResult(
        n=n,
        rps=rps,
        time_scale=time_scale,
        seeds=tuple(seeds),
        dataset=dataset,
        policies=means,
        per_seed=per_seed,
        orders=agreements,
        command=command,
    )


def _live_summary(rows: list[JobResult], jobs: list[ReplayJob], time_scale: float) -> LiveSummary:
    pairs = list(zip(rows, jobs, strict=True))
    n = len(pairs)

    def share(spent_ms: Callable[[JobResult], float]) -> float:
        # Real time spent over real (time_scale-compressed) E2E, averaged over workflows: at time_scale 1
        # that is the share at the profile's speed; above 1 it is an upper bound of it.
        return float(sum(spent_ms(r) / (1000 * r.e2e_s) for r, _ in pairs)) / n

    return LiveSummary(
        latency_per_token_ms=sum(1000 * r.e2e_s * time_scale / max(1, sum(j.lengths)) for r, j in pairs) / n,
        score=sum(j.job.runs[r.model].score for r, j in pairs) / n,
        dispatch_share_of_e2e=share(lambda r: r.dispatch_ms),
        router_share_of_e2e=share(lambda r: r.router_ms),
        predictor_share_of_e2e=share(lambda r: r.predictor_ms),
        scheduler_share_of_e2e=share(lambda r: r.policy_ms) + share(lambda r: r.redis_ms),
        dispatch_ms_per_workflow=sum(r.dispatch_ms for r, _ in pairs) / n,
        share_7b=sum(r.model == "qwen2.5-7b" for r, _ in pairs) / n,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Live replay through the real services vs the simulator.")
    parser.add_argument("--n", type=int, default=60)
    parser.add_argument("--rps", type=float, default=4.0)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[7])
    parser.add_argument("--dataset", default="math")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--report-only", type=Path, help="rewrite the tables from this replay.json")
    args = parser.parse_args(argv)
    if args.report_only:
        data = ReplayResult.from_dict(json.loads(args.report_only.read_text()))
    else:
        command = "python -m bench.sweep.replay " + " ".join(argv if argv is not None else sys.argv[1:])
        with tempfile.TemporaryDirectory(prefix="chimera-replay-") as tmp:
            data = replay(args.n, args.rps, args.time_scale, args.seeds, args.dataset, Path(tmp), command)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "replay.json").write_text(json.dumps(data.to_dict(), indent=1) + "\n")
    (args.out / "replay.md").write_text(table(data) + f"\nCommand: `{data.command}`\n")
    sys.stdout.write(table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
