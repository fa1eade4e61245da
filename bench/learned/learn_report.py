"""The learning loop's figures: router mAP on the held-out labelled tasks, the live eval before and after,
the labels collected, the versions served; as JSON and markdown (``real_learn.json``/``real_learn.md``).

mAP is ``services.router.training.macro_map`` (per model, average precision of its predicted success
probability over the held-out tasks; a model whose held-out labels are one class is left out). The
prior-only floor is the text-blind per-model success rate (``PriorRouter(per_workflow=False)``) fitted on
the rows the retrain saw: it scores every task of a model alike, so its AP is that model's held-out pass
rate whatever it was fitted on.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.learned.learn_jobs import JobRun
from bench.learned.learn_plan import label_counts
from bench.learned.learn_serve import LabelRecord
from bench.live.policy import PolicyRun
from bench.live.sim import live_outcome
from services.common import artifacts
from services.common.types import OutcomeRow, TraceRow
from services.router.backends import RouterBackend, RouterExample
from services.router.prior import PriorRouter
from services.router.training import macro_map


@dataclass(frozen=True, slots=True)
class MapScore:
    router: str  # the artifact version scored, or a floor's name
    map: float | None
    per_model: Mapping[str, float]
    # The same within each workflow: across workflows a router also ranks by the workflow (pass rates differ
    # a lot between them), within one it can only rank by the task text.
    by_workflow: Mapping[str, float | None]

    def to_json(self) -> dict[str, Any]:
        return {
            "router": self.router,
            "map": _r(self.map),
            "per_model": {m: round(v, 4) for m, v in self.per_model.items()},
            "by_workflow": {w: _r(v) for w, v in self.by_workflow.items()},
        }


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def score(name: str, backend: RouterBackend, examples: Sequence[RouterExample]) -> MapScore:
    """mAP of ``backend`` on ``examples``, overall and per workflow."""
    m, per = macro_map(backend, examples)
    flows = sorted({e.workflow for e in examples})
    by = {w: macro_map(backend, [e for e in examples if e.workflow == w])[0] for w in flows}
    return MapScore(name, m, per, by)


def score_version(kind_dir: Path, version: str, examples: Sequence[RouterExample]) -> MapScore:
    """mAP of one published router version."""
    return score(version, artifacts.load_version(kind_dir, version), examples)


def floors(
    traces: Sequence[TraceRow], outcomes: Sequence[OutcomeRow], examples: Sequence[RouterExample]
) -> dict[str, MapScore]:
    """The text-blind routers fitted on the learned rows: per model (``prior_only``, the floor
    ``train_router`` reports) and per model and workflow (``prior_workflow``)."""
    out = {}
    for name, per_workflow in (("prior_only", False), ("prior_workflow", True)):
        floor = PriorRouter(per_workflow=per_workflow)
        floor.fit(traces, outcomes)
        out[name] = score(name.replace("_", "-"), floor, examples)
    return out


def eval_summary(run: PolicyRun) -> dict[str, Any]:
    """A replay's figures (``bench.live.run``'s own: pass rate, E2E p50/mean, each model's share)."""
    o = live_outcome(run)
    return {
        "policy": run.policy,
        "wall_s": run.wall_s,
        "score": round(o.score, 4),
        "e2e_p50_s": round(o.e2e_p50_s, 2),
        "e2e_mean_s": round(o.e2e_mean_s, 2),
        "share": {m: round(v, 3) for m, v in o.share.items()},
        "queue_mean_s": {m: round(v, 2) for m, v in o.queue_mean_s.items()},
        "failed": o.failed,
        "pinned_threads": dict(run.pinned_threads),
    }


def beside_live(path: Path, config: Mapping[str, Any]) -> dict[str, Any]:
    """``bench.live.run``'s policies on the same first workflows of the same trace (its records cut to the
    eval's length), when ``path`` holds a run of that trace on the same engines; {} otherwise. Another run, at
    another time, its router trained offline on ``bench/data/real``: context, not part of the loop."""
    from bench.live.run import (
        run_from,  # the stored records' reader; bench.live.run imports nothing of this loop
    )

    if not path.exists():
        return {}
    d = json.loads(path.read_text())
    c, n = d.get("config", {}), int(config["eval_tasks"])
    same = all(c.get(k) == config[k] for k in ("seed", "rate", "max_tokens", "engines"))
    if not same or c.get("workflow") != config["eval_workflow"] or c.get("tasks", 0) < n:
        return {}
    out: dict[str, Any] = {
        "source": str(path),
        "command": d.get("command"),
        "tasks": c["tasks"],
        "policies": {},
    }
    for name, raw in d.get("runs", {}).items():
        run = run_from(raw)
        cut = dataclasses.replace(run, workflows=run.workflows[:n])
        out["policies"][name] = eval_summary(cut)
    return out


def _delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else round(after - before, 4)


def summary(
    maps: Mapping[str, MapScore],
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    labels: Mapping[str, Mapping[str, int]],
    versions: Mapping[str, Any],
) -> dict[str, Any]:
    """The headline figures (what ``bench.learned.real`` folds into ``real.json``)."""
    b, a = maps["before"].map, maps["after"].map
    return {
        "map_before": None if b is None else round(b, 4),
        "map_after": None if a is None else round(a, 4),
        "map_gain": _delta(a, b),
        "prior_map": _r(maps["prior_only"].map),
        "prior_workflow_map": _r(maps["prior_workflow"].map),
        "live_score_before": before["score"],
        "live_score_after": after["score"],
        "e2e_p50_before_s": before["e2e_p50_s"],
        "e2e_p50_after_s": after["e2e_p50_s"],
        "e2e_mean_before_s": before["e2e_mean_s"],
        "e2e_mean_after_s": after["e2e_mean_s"],
        "share_before": before["share"],
        "share_after": after["share"],
        "labels": dict(labels),
        "router_before": versions.get("router_bootstrap"),
        "router_after": versions.get("router_retrained"),
    }


@dataclass(frozen=True, slots=True)
class LoopRecord:
    """Everything one run measured, as the report needs it."""

    command: str
    started_utc: str
    config: Mapping[str, Any]
    eval_problems: Sequence[str]
    arrivals_s: Sequence[float]
    map_tasks: Sequence[tuple[str, str]]
    map_examples: int
    maps: Mapping[str, MapScore]  # "before", "after", "prior_only", "prior_workflow"
    before: PolicyRun
    after: PolicyRun
    labels: Sequence[LabelRecord]  # the learning phase's workflows, as the client saw them
    learned_outcomes: Sequence[OutcomeRow]  # what the export wrote: the retrain's labels
    exported_traces: int
    pinned: Mapping[str, int]
    jobs: Sequence[JobRun]
    versions: Mapping[str, Any]
    timings_s: Mapping[str, float]
    beside: Mapping[str, Any]  # beside_live's answer


def flips(before: PolicyRun, after: PolicyRun) -> int:
    """Eval tasks served by the same model in both passes whose verified outcome differs."""
    n = 0
    for b, a in zip(before.workflows, after.workflows, strict=True):
        if b.model and b.model == a.model and (b.score or 0.0) != (a.score or 0.0):
            n += 1
    return n


def _notes(result: Mapping[str, Any]) -> list[str]:
    s, cfg = result["summary"], result["config"]
    n = cfg["eval_tasks"]
    served = len({r["problem_id"] for r in result["learning"]["labels"]})
    return [
        f"Small samples: the live eval is {n} workflows, so one task moves the pass rate by {1 / n:.3f};"
        f" the mAP is over {result['map']['tasks']} tasks per model. Neither difference is a significance"
        " test.",
        "The retrain is the product's task as shipped: `train_router` holds out 20% of the tasks (by a hash"
        " of the text) to report its own metrics and fits the published model on the rest, so the live router"
        " learned from about 80% of the labels counted above.",
        f"The eval trace is the first {n} workflows of `bench.live.run`'s trace (seed {cfg['seed']}, the same"
        f" arrivals); all {cfg['live_tasks']} of that trace's tasks are kept out of training, and the"
        f" learning phase served {served} other HumanEval problems.",
        "Temperature 0 is not bitwise repeatable on the CPU under different batches: of the eval tasks served"
        f" by the same model in both passes, {result['flips']} changed outcome between them.",
        "Before/after E2E differ by routing and by run-to-run noise of shared hardware; the mean E2E moved"
        f" {s['e2e_mean_after_s'] - s['e2e_mean_before_s']:+.1f} s.",
    ]


def build(rec: LoopRecord) -> dict[str, Any]:
    """The JSON of ``real_learn.json`` (``markdown`` renders it)."""
    b, a = eval_summary(rec.before), eval_summary(rec.after)
    engines = rec.config["engines"]
    done = {e: {r.task for r in rec.labels if r.engine == e and r.score is not None} for e in engines}
    result: dict[str, Any] = {
        "command": rec.command,
        "started_utc": rec.started_utc,
        "config": dict(rec.config),
        "eval_problems": list(rec.eval_problems),
        "arrivals_s": list(rec.arrivals_s),
        "map": {
            "tasks": len(rec.map_tasks),
            "examples": rec.map_examples,
            "task_ids": [list(t) for t in rec.map_tasks],
            **{k: m.to_json() for k, m in rec.maps.items()},
        },
        "before": b,
        "after": a,
        "flips": flips(rec.before, rec.after),
        # every eval workflow's record, kept apart: bench.learned.real folds "before"/"after" into real.json
        "eval_workflows": {
            "before": [asdict(w) for w in rec.before.workflows],
            "after": [asdict(w) for w in rec.after.workflows],
        },
        "learning": {
            "labels": [asdict(r) for r in rec.labels],
            "both": len(set.intersection(*done.values())) if done else 0,
            "pinned_threads": dict(rec.pinned),
            "exported_outcomes": len(rec.learned_outcomes),
            "exported_traces": rec.exported_traces,
        },
        "jobs": [asdict(j) for j in rec.jobs],
        "versions": dict(rec.versions),
        "timings_s": {k: round(v, 1) for k, v in rec.timings_s.items()},
        "summary": summary(rec.maps, b, a, label_counts(rec.learned_outcomes), rec.versions),
        "bench_live": dict(rec.beside),
    }
    result["notes"] = _notes(result)
    return result


def _f(v: Any, fmt: str = ".3f") -> str:
    return "–" if v is None else format(v, fmt)


def markdown(result: Mapping[str, Any]) -> str:
    cfg, s, t = result["config"], result["summary"], result["timings_s"]
    maps, v = result["map"], result["versions"]
    flows = sorted(maps["before"]["by_workflow"])
    lines = [
        "# The learning loop live",
        "",
        f"Command: `{result['command']}`. Written by the command from one run, started"
        f" {result['started_utc']} UTC, {t['total']:.0f} s in all. Pool `{cfg['pool']}`, engines"
        f" {', '.join(cfg['engines'])}, each worker pinned to its own core; one private Redis.",
        "",
        "What ran, in order: the router and predictor bootstrapped from the synthetic stand-ins (as"
        f" `chimera up` does with no artifacts: {cfg['bootstrap_workflows']} generated workflows);"
        f" **before**: the eval trace ({cfg['eval_tasks']} held-out HumanEval `{cfg['eval_workflow']}`"
        f" workflows, Poisson at {cfg['rate']}/s, {'+'.join(map(str, cfg['max_tokens']))} tokens,"
        f" Chimera at τ = {cfg['tau']:g}) on a fresh stack;"
        f" **learning**: a fresh stack served training tasks ({', '.join(cfg['learn_workflows'])},"
        f" {cfg['learn_max_tokens']} tokens a stage) for {cfg['learn_s']:.0f} s, each pinned once to each"
        " model, verified in the sandbox and the score sent with EndProgram; then the product's Celery tasks"
        " (`export_traces`, `retrain_router`, `retrain_predictor`) ran in a real `python -m services.jobs`"
        " worker and the live router hot-reloaded the new version; **after**: the same eval trace on a fresh"
        " stack (new engines, so vLLM's prefix cache holds nothing of the before pass) serving the retrained"
        " models.",
        "",
        "## Router mAP on the held-out labelled tasks",
        "",
        f"{maps['tasks']} (problem, workflow) tasks of `{cfg['data']}` with a real verified outcome on both"
        f" engines ({maps['examples']} examples); none of their problems was served in the learning phase.",
        "",
        "| router | version | macro mAP | "
        + " | ".join([*(f"AP {m}" for m in cfg["models"]), *(f"mAP within {w}" for w in flows)])
        + " |",
        "|---|---|---|" + "---|" * (len(cfg["models"]) + len(flows)),
    ]
    for name in ("before", "after", "prior_only", "prior_workflow"):
        m = maps[name]
        cells = [_f(m["per_model"].get(x)) for x in cfg["models"]]
        cells += [_f(m["by_workflow"].get(w)) for w in flows]
        lines.append(f"| {name.replace('_', '-')} | `{m['router']}` | {_f(m['map'])} | {' | '.join(cells)} |")
    lines += [
        "",
        "prior-only: each model's learned success rate, the same for every task (`train_router`'s floor);"
        " prior-workflow: the same per workflow. Both are fitted on the rows the retrain saw. Across"
        " workflows a router also ranks by the workflow; within one (the last columns) only by the text.",
    ]
    lines += [
        "",
        "## Live eval at a fixed τ, before and after",
        "",
        "| pass | router served | pass rate | E2E p50 s | E2E mean s | failed | share per model |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in ("before", "after"):
        e = result[name]
        share = ", ".join(f"{m} {x:.2f}" for m, x in e["share"].items())
        lines.append(
            f"| {name} | `{v[f'router_served_{name}']}` | {e['score']:.3f} | {e['e2e_p50_s']:.1f} |"
            f" {e['e2e_mean_s']:.1f} | {e['failed']} | {share} |"
        )
    beside = result.get("bench_live") or {}
    if beside.get("policies"):
        lines += [
            "",
            f"For context, `bench.live.run`'s policies on the same {cfg['eval_tasks']} workflows (the first"
            f" {cfg['eval_tasks']} of its records in `{beside['source']}`, from `{beside['command']}`:"
            " another run at another time, its Chimera router trained offline on all of `bench/data/real`"
            + (
                f"; there the trace went on to {beside['tasks']} arrivals, which loaded the engines too):"
                if beside["tasks"] > cfg["eval_tasks"]
                else "):"
            ),
            "",
            "| bench.live.run policy | pass rate | E2E p50 s | E2E mean s | share per model |",
            "|---|---|---|---|---|",
        ]
        for name, e in beside["policies"].items():
            share = ", ".join(f"{m} {x:.2f}" for m, x in e["share"].items())
            lines.append(
                f"| {name} | {e['score']:.3f} | {e['e2e_p50_s']:.1f} | {e['e2e_mean_s']:.1f} | {share} |"
            )
    lines += [
        "",
        "## Labels the loop collected",
        "",
        "| model | labels | passed | pass rate |",
        "|---|---|---|---|",
    ]
    for m, c in s["labels"].items():
        rate = c["passed"] / c["labels"] if c["labels"] else None
        lines.append(f"| {m} | {c['labels']} | {c['passed']} | {_f(rate)} |")
    lines += [
        "",
        f"Training tasks labelled on both models: {result['learning']['both']}. Jobs (sent through Celery,"
        " result and seconds):",
        "",
    ]
    for j in result["jobs"]:
        shown = {k: v for k, v in j["result"].items() if k != "streams"}  # the export's per-stream paths
        lines.append(f"- `{j['task']}`: `{shown}` ({j['wall_s']:.1f} s)")
    lines += [
        "",
        f"Router versions: bootstrap `{v['router_bootstrap']}` → retrained `{v['router_retrained']}`; the"
        f" live router answered Describe with the new version {_f(v['router_reload_s'], '.1f')} s after the"
        f" task returned. Predictor: `{v['predictor_bootstrap']}` → `{v['predictor_retrained']}`"
        f" (served after {_f(v['predictor_reload_s'], '.1f')} s).",
        "",
        "The retrained router's own metrics (its artifact's, on the 20% of the learned tasks `train_router`"
        f" held out): `{v.get('router_retrained_metrics')}`.",
        "",
        "Timings (s): " + ", ".join(f"{k} {x:.0f}" for k, x in t.items()) + ".",
        "",
        "## Notes",
        "",
        *[f"- {n}" for n in result["notes"]],
        "",
    ]
    return "\n".join(lines)
