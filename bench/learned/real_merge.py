"""The companions of ``real.json``: the live evaluation and the learning loop, folded in by
``bench.learned.real``.

Issue 15 asks for one results file with every figure of the real pool. The live runs are too slow to redo
whenever ``bench.learned.real`` (3 s) runs, so they keep their own files (``real_live.json`` from
``bench.live.run``, ``real_learn.json`` from ``bench.learned.learn_live``) and ``bench.learned.real`` copies
their summaries in, saying which file and command each came from. A companion that has not been run is
reported as missing, not guessed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

LIVE = "real_live.json"
LEARN = "real_learn.json"
POOLED = "real_live_seeds.json"  # bench.live.seeds: the must-show over several traces


def _read(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    out: dict[str, Any] = json.loads(path.read_text())
    return out


def _live(d: Mapping[str, Any]) -> dict[str, Any]:
    policies = {
        name: {
            side: {k: p[side][k] for k in ("score", "e2e_p50_s", "e2e_mean_s", "share")}
            for side in ("live", "sim")
            if p.get(side)
        }
        for name, p in d.get("policies", {}).items()
    }
    return {
        "source": LIVE,
        "command": d.get("command"),
        "config": d.get("config"),
        "frontier": policies,
        "must_show": d.get("must_show"),
        "not_run": d.get("not_run", []),
    }


def _learn(d: Mapping[str, Any]) -> dict[str, Any]:
    # The learning loop's own summary, whatever it holds: its report owns the field names.
    body = {k: v for k, v in d.items() if k in ("summary", "before", "after", "must_show", "config")}
    return {"source": LEARN, "command": d.get("command"), **body}


def companions(out: Path) -> dict[str, Any]:
    """``{"live": ..., "learning_loop": ...}`` from the files beside ``real.json``; None for a missing one."""
    live, learn, pooled = _read(out / LIVE), _read(out / LEARN), _read(out / POOLED)
    return {
        "live": None if live is None else _live(live),
        "live_pooled": None if pooled is None else {"source": POOLED, **pooled},
        "learning_loop": None if learn is None else _learn(learn),
    }


def markdown(c: Mapping[str, Any]) -> list[str]:
    """Lines for ``real.md``: the live frontier and the must-show verdict, and where the loop's are."""
    lines = ["", "## Live evaluation on the real pool (`real_live.*`)", ""]
    live = c.get("live")
    if live is None:
        lines.append(f"Not run yet (`make bench-live` writes `{LIVE}`).")
    else:
        cfg = live["config"] or {}
        lines += [
            f"From `{live['command']}`: {cfg.get('tasks')} held-out `{cfg.get('workflow')}` workflows,"
            f" Poisson arrivals at {cfg.get('rate')}/s. Details, simulator and caveats: `real_live.md`.",
            "",
            "| policy | live pass | live E2E mean s | sim pass | sim E2E mean s |",
            "|---|---|---|---|---|",
        ]
        for name, sides in live["frontier"].items():
            lv, sm = sides.get("live"), sides.get("sim")
            lines.append(
                f"| {name} | {_f(lv, 'score', '.3f')} | {_f(lv, 'e2e_mean_s', '.0f')} |"
                f" {_f(sm, 'score', '.3f')} | {_f(sm, 'e2e_mean_s', '.0f')} |"
            )
        verdict = (live.get("must_show") or {}).get("live") or {}
        if verdict:
            lines += [
                "",
                f"Must show (live): best Chimera `{verdict['best_tau']}`"
                f" **{'holds' if verdict['holds'] else 'does not hold'}** against least-loaded.",
            ]
    pooled = c.get("live_pooled")
    if pooled is not None:
        nan = float("nan")
        best = pooled["best_tau"]
        v = pooled["verdicts"].get(best) or {}
        lines += [
            "",
            f"Must show over {len(pooled['traces'])} traces ({', '.join(pooled['traces'])};"
            f" `real_live_seeds.md`, paired by workflow): best Chimera `{best}`"
            f" **{'holds' if pooled['holds'] else 'does not hold'}**:"
            f" pass {v.get('score_gain', nan):+.3f},"
            f" mean E2E {v.get('e2e_mean_change_s', nan):+.1f} s against least-loaded.",
        ]
    lines += ["", "## The learning loop live (`real_learn.*`)", ""]
    learn = c.get("learning_loop")
    lines.append(
        f"Not run yet (`make bench-learn` writes `{LEARN}`)."
        if learn is None
        else f"From `{learn['command']}`; before/after figures in `real_learn.md` and under"
        " `learning_loop` in `real.json`."
    )
    return lines


def _f(side: Mapping[str, Any] | None, key: str, fmt: str) -> str:
    return "–" if side is None else format(side[key], fmt)
