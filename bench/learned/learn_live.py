"""The learning loop live: ``python -m bench.learned.learn_live`` (``make bench-learn``).

One run, from nothing: the router and predictor start from the product's synthetic bootstrap; an eval
trace is replayed through a fresh stack on the real engines (**before**); a fresh stack serves training
workflows, every answer verified and its score sent with EndProgram (``bench.learned.learn_serve``); a real
Celery worker runs the product's export and retrain tasks and the live router hot-reloads the new version
(``bench.learned.learn_jobs``); the same eval trace is replayed again on a fresh stack (**after**). Router mAP
on held-out labelled tasks is scored for the served version before and after (``bench.learned.learn_report``);
the task sets are in ``bench.learned.learn_plan``. Results: ``bench/results/real_learn.json`` and
``real_learn.md``.

NOTE(fresh engines): the after pass runs on a new stack (new engine processes on the same Redis and the
same artifact folder), so vLLM's prefix cache holds none of the before pass's prompts; each stack also has
its own key prefix, so nothing of one pass (queue, load, traces, outcomes) reaches another.
Not resumable: a rerun wipes the state folder and starts again from the bootstrap, which is the point.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common.paths import dataset_commit
from bench.learned.learn_jobs import JobRun, JobsSetup, jobs_worker, retrain_and_reload, router_version
from bench.learned.learn_plan import map_examples, split
from bench.learned.learn_report import LoopRecord, beside_live, build, floors, markdown, score_version
from bench.learned.learn_serve import LabelRecord, serve_labels
from bench.live.plan import WORKFLOW, arrival_offsets
from bench.live.policy import PROFILES, LiveSetup, private_redis, profile_alone, run_policy, serving_stack
from bench.live.run import run_from  # the reader of stored PolicyRun records
from services.collect.dataset import read_runs
from services.collect.runner import select_engines
from services.common import artifacts
from services.common.redis_proc import PrivateRedisSpec
from services.common.tracestore import read_trace_folder
from services.launcher.bootstrap import ensure_artifacts
from services.launcher.config import LauncherSettings
from services.launcher.pool import load_pool, resolve_pool
from services.verify.answers import load_answer_key
from services.workload.corpus import load_corpus

log = logging.getLogger("bench.learned.learn_live")
RESULT = "real_learn"
FACTS = "facts"  # the run's own figures besides the records (command, config, versions, timings)
_CHECKPOINTS = tuple(f"{n}.json" for n in ("before", "learning", "after", FACTS))
_WIPE = ("artifacts", "traces", "jobs", "redis", "logs", PROFILES, *_CHECKPOINTS)


def _fresh_state(state: Path, profiles_from: Path | None) -> str:
    """Empty the run's own folders; reuse measured engine profiles from ``profiles_from`` when given and
    present (profiling both engines alone costs minutes); where the profiles came from."""
    for name in _WIPE:
        p = state / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    state.mkdir(parents=True, exist_ok=True)
    if profiles_from is not None and profiles_from.exists():
        shutil.copyfile(profiles_from, state / PROFILES)
        return str(profiles_from)
    return "measured in this run (bench.live.policy.profile_alone)"


def _checkpoint(state: Path, name: str, body: Any) -> None:
    """A phase's records in the state folder as soon as it ends: a run that dies later still shows them."""
    (state / f"{name}.json").write_text(json.dumps(body, indent=1) + "\n")


def _check_served(router_dir: Path, version: str, models: Sequence[str]) -> None:
    """The after pass must serve ``version``: still CURRENT, and knowing every model of the pool (a stack
    whose router artifact lacks one bootstraps a new synthetic version at start)."""
    current = artifacts.current_version(router_dir)
    if current != version:
        raise RuntimeError(f"the router folder serves {current}, not the retrained {version}")
    missing = set(models) - set(artifacts.load_meta(router_dir, version).models)
    if missing:
        raise RuntimeError(f"the retrained router has no label for {sorted(missing)}: the loop cannot go on")


def _env(tau: float) -> dict[str, str]:
    return {"CHIMERA_DISPATCHER_POLICY": "chimera", "CHIMERA_DISPATCHER_TAU": f"{tau:g}"}


def run(args: argparse.Namespace, command: str) -> dict[str, Any]:
    t_start = time.monotonic()
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
    state: Path = args.state_dir.resolve()
    pool_file = resolve_pool(Path(args.pool))
    pool = select_engines(load_pool(pool_file), args.engines)
    engines = {e.id: e.model for e in pool.engines}
    profiles_src = _fresh_state(state, args.profiles_from)
    setup = LiveSetup(state, pool_file, pool, args.data, tuple(args.max_tokens), not args.no_pin_cores)

    corpus = load_corpus(use_fallback=False).problems
    key = load_answer_key(sources=("humaneval",))
    checked = {p.id for p in corpus if key.get(p.id) is not None}
    runs = read_runs(args.data)
    plan = split(
        corpus, checked, runs, list(engines.values()), args.eval_tasks, args.live_tasks,
        args.train_tasks, args.seed, args.learn_workflows,
    )  # fmt: skip
    offsets = arrival_offsets(args.eval_tasks, args.rate, args.seed)
    blank = [""] * args.eval_tasks

    # The product's bootstrap with `chimera up`'s own settings (the stacks below would otherwise bootstrap
    # with the ephemeral test settings: 300 workflows of the embedded corpus).
    up = LauncherSettings()
    t0 = time.monotonic()
    # Synthetic only (real_folder=None): the loop starts from what a pool no real trace covers would have.
    dirs = ensure_artifacts(
        pool, state / "artifacts", up.bootstrap_workflows, up.seed, up.embedded_corpus, real_folder=None
    )
    boot = {
        k: artifacts.current_version(d) for k, d in (("router", dirs.router), ("predictor", dirs.predictor))
    }
    timings = {"bootstrap": time.monotonic() - t0}

    traces_dir = state / "traces" / "learn"
    prefix = f"learn{uuid.uuid4().hex[:8]}"
    with private_redis(state) as redis_url:
        t0 = time.monotonic()
        profile_alone(setup, redis_url)
        timings["profiles"] = time.monotonic() - t0
        t0 = time.monotonic()
        before = run_policy(setup, f"before-chimera-tau{args.tau:g}", _env(args.tau), plan.eval_trace, blank,
                            offsets, key, redis_url)  # fmt: skip
        timings["before_eval"] = time.monotonic() - t0
        _checkpoint(state, "before", asdict(before))
        jobs_setup = JobsSetup(
            PrivateRedisSpec(state / "redis").socket, prefix, traces_dir, state / "artifacts",
            state / "jobs", args.min_rows,
        )  # fmt: skip
        t0 = time.monotonic()
        with (
            jobs_worker(jobs_setup, state / "logs" / "jobs.log") as app,
            serving_stack(setup, redis_url, prefix, _env(args.tau)) as (stack, pinned),
        ):
            timings["learn_start"] = time.monotonic() - t0
            served_before = router_version(stack.router_addr)
            t0 = time.monotonic()
            slots = {e.id: e.max_num_seqs for e in pool.engines}
            labels = asyncio.run(
                serve_labels(
                    stack.dispatcher_addr, engines, plan.training, slots, args.learn_s,
                    args.learn_max_tokens, key,
                )
            )  # fmt: skip
            timings["learn_serve"] = time.monotonic() - t0
            t0 = time.monotonic()
            jobs = retrain_and_reload(app, stack.router_addr, stack.predictor_addr, args.job_timeout_s)
            timings["jobs_and_reload"] = time.monotonic() - t0
        new_router, new_predictor = str(jobs[1].result["version"]), str(jobs[2].result["version"])
        _check_served(dirs.router, new_router, pool.models)
        _checkpoint(
            state, "learning", {"labels": [asdict(r) for r in labels], "jobs": [asdict(j) for j in jobs]}
        )
        t0 = time.monotonic()
        after = run_policy(setup, f"after-chimera-tau{args.tau:g}", _env(args.tau), plan.eval_trace, blank,
                           offsets, key, redis_url)  # fmt: skip
        timings["after_eval"] = time.monotonic() - t0
        _checkpoint(state, "after", asdict(after))
        _check_served(dirs.router, new_router, pool.models)  # the after stack did not re-bootstrap
    timings["total"] = time.monotonic() - t_start

    versions = {
        "router_bootstrap": boot["router"],
        # The only version published before the retrain; the learning stack's router, started on the same
        # folder after the before pass, answered Describe with it (router_served_learning).
        "router_served_before": boot["router"],
        "router_retrained": new_router,
        # train_router's own figures on its 20% holdout of the learned rows (what the artifact records)
        "router_retrained_metrics": artifacts.load_meta(dirs.router, new_router).metrics,
        "router_served_after": new_router,
        "router_served_learning": served_before,
        "router_reload_s": jobs[1].result["served_after_s"],
        "predictor_bootstrap": boot["predictor"],
        "predictor_retrained": new_predictor,
        "predictor_reload_s": jobs[2].result["served_after_s"],
    }
    config = {
        "pool": args.pool,
        "engines": list(engines),
        "models": list(engines.values()),
        "tau": args.tau,
        "eval_tasks": args.eval_tasks,
        "live_tasks": args.live_tasks,
        "rate": args.rate,
        "seed": args.seed,
        "max_tokens": list(args.max_tokens),
        "eval_workflow": WORKFLOW,
        "learn_s": args.learn_s,
        "learn_workflows": list(args.learn_workflows),
        "learn_max_tokens": args.learn_max_tokens,
        "train_tasks": args.train_tasks,
        "min_rows": args.min_rows,
        "data": str(args.data),
        "dataset_commit": dataset_commit(args.data),
        "bootstrap_workflows": up.bootstrap_workflows,
        "profiles": profiles_src,
        "pin_cores": not args.no_pin_cores,
    }
    facts = {
        "command": command,
        "started_utc": started,
        "config": config,
        "eval_problems": [p.id for p in plan.eval_trace],
        "arrivals_s": offsets,
        "map_tasks": [list(t) for t in plan.map_tasks],
        "pinned_threads": pinned,
        "versions": versions,
        "timings_s": timings,
    }
    _checkpoint(state, FACTS, facts)
    return report(facts, state, args.out)


def report(facts: Mapping[str, Any], state: Path, out: Path) -> dict[str, Any]:
    """The results from a run's records: its facts (what ``run`` measured besides the records), the phases'
    checkpoints, the exported rows and the published artifacts in ``state``. ``--report-only`` calls it on
    a finished run's state folder; every figure is recomputed from the same records."""
    cfg = facts["config"]
    before = run_from(json.loads((state / "before.json").read_text()))
    after = run_from(json.loads((state / "after.json").read_text()))
    learning = json.loads((state / "learning.json").read_text())
    learned_traces, learned_outcomes = read_trace_folder(state / "traces" / "learn")
    data = Path(cfg["data"])
    runs = read_runs(data)
    traces, outcomes = read_trace_folder(data)
    tasks = tuple((str(p), str(w)) for p, w in facts["map_tasks"])
    examples = map_examples(traces, outcomes, runs, tasks)
    router_dir, v = state / "artifacts" / "router", facts["versions"]
    maps = {
        "before": score_version(router_dir, v["router_bootstrap"], examples),
        "after": score_version(router_dir, v["router_retrained"], examples),
        **floors(learned_traces, learned_outcomes, examples),
    }
    return build(
        LoopRecord(
            command=facts["command"],
            started_utc=facts["started_utc"],
            config=cfg,
            eval_problems=tuple(facts["eval_problems"]),
            arrivals_s=tuple(facts["arrivals_s"]),
            map_tasks=tasks,
            map_examples=len(examples),
            maps=maps,
            before=before,
            after=after,
            labels=tuple(LabelRecord(**r) for r in learning["labels"]),
            learned_outcomes=tuple(learned_outcomes),
            exported_traces=len(learned_traces),
            pinned=facts["pinned_threads"],
            jobs=tuple(JobRun(**j) for j in learning["jobs"]),
            versions=v,
            timings_s=facts["timings_s"],
            beside=beside_live(out / "real_live.json", cfg),
        )
    )


def write(out: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{RESULT}.md").write_text(markdown(result))
    tmp = out / f".{RESULT}.json.tmp"
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(out / f"{RESULT}.json")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", default="qwen-coder-3", help="pool YAML or embedded pool name")
    ap.add_argument("--engines", nargs="+", default=["coder-0_5b", "coder-1_5b"])
    ap.add_argument("--tau", type=float, default=2.0, help="Chimera's latency slack in both eval passes")
    # Sized for 2 cores: two eval passes of bench.live.run's whole trace (16 workflows: its alone runs took
    # 200 s on the 0.5B and 450 s on the 1.5B, the worst case) and a 10-minute learning phase; the run of
    # real_learn.md took 22 minutes in all (26 labels on the 1.5B, 54 on the 0.5B).
    ap.add_argument(
        "--eval-tasks", type=int, default=16, help="the first N workflows of bench.live.run's trace"
    )
    ap.add_argument(
        "--live-tasks", type=int, default=16, help="bench.live.run's trace length (kept out of training)"
    )
    ap.add_argument("--rate", type=float, default=0.12, help="eval arrivals per second (bench.live.run's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, nargs="+", default=[128, 256], help="eval, per stage")
    ap.add_argument("--learn-s", type=float, default=600.0, help="seconds the learning phase starts tasks")
    # Taken in turn: one-stage code/coder, the cheapest label (a third of the 1.5B engine time of a
    # planner->coder workflow, and the 1.5B engine is the phase's bottleneck), and the eval's own workflow,
    # without which the retrained router would know one workflow only: real pass rates differ a lot between
    # workflows (bench/data/real: the 1.5B passes 0.89 of code/coder, 0.44 of planner->coder at 512 tokens),
    # and the bootstrap's synthetic router already ranks by workflow.
    ap.add_argument("--learn-workflows", nargs="+", default=["code/coder", WORKFLOW])
    ap.add_argument("--learn-max-tokens", type=int, default=256)
    ap.add_argument("--train-tasks", type=int, default=90, help="training tasks drawn (of 93 left)")
    ap.add_argument("--min-rows", type=int, default=10, help="CHIMERA_JOBS_RETRAIN_MIN_ROWS for the worker")
    ap.add_argument("--job-timeout-s", type=float, default=600.0)
    ap.add_argument("--data", type=Path, default=Path("bench/data/real"))
    ap.add_argument("--state-dir", type=Path, default=Path(".chimera/learn"))
    ap.add_argument("--profiles-from", type=Path, default=Path(".chimera/live/profiles.json"))
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--no-pin-cores", action="store_true")
    ap.add_argument(
        "--report-only", action="store_true", help="rewrite the results from the state folder's records"
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    command = "python -m bench.learned.learn_live " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.report_only:
        state = args.state_dir.resolve()
        result = report(json.loads((state / f"{FACTS}.json").read_text()), state, args.out)
    else:
        result = run(args, command.strip())
    write(args.out, result)
    sys.stdout.write((args.out / f"{RESULT}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
