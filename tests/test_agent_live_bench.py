"""The live coding-agent benchmark (``bench.live.agent``): its policies, its held-out draw, its paired
figures on hand-made records (FAKE loops, named as such), and one policy run end to end through a real
stack of processes on SIMULATED engines (a measuring instrument: they submit the placeholder ``"x"``, so
every loop fails and runs to its turn limit)."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from bench.live.agent import AgentLiveConfig, agent_policy, default_policies, held_out, run_policy
from bench.live.agent_report import markdown, summarise
from bench.live.policy import LiveSetup, private_redis
from services.launcher.pool import load_pool, resolve_pool
from services.verify.answers import AnswerKey
from services.verify.checks import HumanEvalCheck
from services.workload.corpus import Problem

ENGINES = ("small", "big")


@pytest.mark.unit
def test_escalation_is_a_variant_of_a_policy_that_chooses() -> None:
    policy, env = agent_policy("chimera-tau2-escalate", ENGINES)
    assert (policy.dispatcher_policy, policy.tau, env) == (
        "chimera",
        2.0,
        {"CHIMERA_DISPATCHER_ESCALATE": "1"},
    )
    _, env = agent_policy("chimera-tau2-no-continuation", ENGINES)
    assert env == {"CHIMERA_DISPATCHER_ESCALATE": "0", "CHIMERA_DISPATCHER_CONTINUATION": "0"}
    policy, env = agent_policy("chimera-tau0.5-escalate3", ENGINES)
    assert policy.tau == 0.5 and env["CHIMERA_DISPATCHER_ESCALATION_TAU"] == "3"
    assert agent_policy("alone-big", ENGINES)[0].pin == "alone-big"
    for name in ("alone-big-escalate", "least-loaded-escalate"):
        with pytest.raises(ValueError, match="escalation belongs"):
            agent_policy(name, ENGINES)
    assert default_policies(ENGINES) == [
        "alone-small",
        "alone-big",
        "least-loaded",
        "chimera-tau2",
        "chimera-tau2-escalate",
        "chimera-tau0.5-escalate3",
        "chimera-tau2-no-continuation",
    ]


@pytest.mark.unit
def test_the_held_out_draw_skips_what_was_trained_on_and_alternates_sources() -> None:
    problems = [Problem(f"humaneval/{i}", f"t{i}", "code", 0.5, "humaneval") for i in range(6)]
    problems += [Problem(f"leetcode/{i}", f"l{i}", "code", 0.5, "leetcode") for i in range(6)]
    ids = {p.id for p in problems}
    drawn = held_out(problems, {"humaneval/0", "leetcode/1"}, ids, 6, seed=0)
    assert len(drawn) == 6 and not {"humaneval/0", "leetcode/1"} & {p.id for p in drawn}
    assert [p.source for p in drawn] == ["humaneval", "leetcode"] * 3
    assert drawn == held_out(problems, {"humaneval/0", "leetcode/1"}, ids, 6, seed=0)
    with pytest.raises(ValueError, match="only 10"):
        held_out(problems, {"humaneval/0", "leetcode/1"}, ids, 11, seed=0)


def _fake_loop(index: int, passed: bool, e2e: float, engines: list[str]) -> dict[str, Any]:
    turns = [
        {"engine": e, "prompt_tokens": 400, "cached_tokens": 256 if k else 0, "passed": False}
        for k, e in enumerate(engines)
    ]
    return {
        "index": index,
        "passed": passed,
        "e2e_s": e2e,
        "n_turns": len(engines),
        "error": None,
        "turns": turns,
        "escalated": len(set(engines)) > 1,
    }


@pytest.mark.unit
def test_the_report_pairs_loops_and_judges_the_must_show() -> None:
    n = 10
    runs = {
        "alone-big": {"wall_s": 1, "loops": [_fake_loop(i, i < 5, 100.0, ["big"]) for i in range(n)]},
        "least-loaded": {"wall_s": 1, "loops": [_fake_loop(i, i < 2, 60.0, ["small"]) for i in range(n)]},
        "chimera-tau2-escalate": {
            "wall_s": 1,
            "loops": [_fake_loop(i, i < 5, 50.0, ["small", "big"]) for i in range(n)],
        },
    }
    s = summarise(runs, ENGINES)
    assert s["strong_alone"] == "alone-big"
    row = s["policies"]["chimera-tau2-escalate"]
    assert row["escalated"] == n and row["passed_after_escalation"] == 5
    assert row["turn_share"] == {"small": 0.5, "big": 0.5} and row["cached_share_after_a_tool"] == 0.64
    vs_big = s["paired"]["chimera-tau2-escalate"]["alone-big"]
    assert vs_big["pass_diff"] == 0.0 and vs_big["e2e_ratio"] == 0.5 and vs_big["e2e_diff_90_s"] == [-50, -50]
    lo, hi = s["paired"]["chimera-tau2-escalate"]["least-loaded"]["pass_diff_90"]
    assert 0.0 < lo <= 0.3 <= hi
    assert all(s["must_show"]["chimera-tau2-escalate"].values())
    cfg = {"engines": list(ENGINES), "tasks": n, "max_turns": 4, "max_tokens": 512, "rate": 0.04, "seed": 0}
    md = markdown({"command": "fake", "config": {**cfg, "pool": "fake"}, "summary": s})
    assert "| chimera-tau2-escalate | 10 | 0 | 0.500 |" in md and "Not run yet: alone-small." in md


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_policy_runs_the_loops_through_a_real_stack(tmp_path: Path) -> None:
    pool_file = resolve_pool(Path("simulated"))
    pool = load_pool(pool_file)
    engines = tuple(e.id for e in pool.engines)
    add = HumanEvalCheck(
        prompt='def add(a: int, b: int) -> int:\n    """Return the sum of a and b."""\n',
        test="def check(candidate):\n    assert candidate(2, 3) == 5\n",
        entry_point="add",
    )
    problems = [Problem(f"humaneval/add{i}", add.prompt, "code", 0.1, "humaneval") for i in range(2)]
    key = AnswerKey(MappingProxyType({p.id: add for p in problems}))
    config = AgentLiveConfig("simulated", engines, 2, 0, 1.0, 2, 32, "bench/data/real", "bench/data/agent")
    setup = LiveSetup(tmp_path, pool_file, pool, Path("bench/data/real"), (32,), pin_cores=False)
    with private_redis(tmp_path) as redis_url:
        run = run_policy(setup, config, "chimera-tau2", problems, key, redis_url)
    assert run["env"]["CHIMERA_DISPATCHER_ESCALATE"] == "0"
    loops = sorted(run["loops"], key=lambda r: r["index"])
    assert [r["problem_id"] for r in loops] == ["humaneval/add0", "humaneval/add1"]
    for r in loops:
        assert r["error"] is None and not r["passed"] and r["n_turns"] == 2  # the placeholder never passes
        assert [t["identity"] for t in r["turns"]] == ["new", "continuation"]
        assert len({t["program_id"] for t in r["turns"]}) == 1 and r["engines"][0] in engines
