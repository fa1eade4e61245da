"""What the live evaluation runs: held-out tasks, one arrival trace, the policies and the engine each pins.

NOTE(live plan): every policy replays the SAME trace: the same held-out HumanEval problems (none of them in
``bench/data/real``, which the router and predictor are trained on), as the same two-stage workflow, at the
same seeded Poisson arrival offsets. A policy is either a dispatcher policy choosing the engine itself
(Chimera at a tau, chimera-plus, vLLM's least-loaded balancer) or a client-side assignment that pins each
workflow to a model through the front door's ``model`` field (each model alone, round-robin by arrival, and
the oracle router). Pinned policies run under the dispatcher's ``vllm`` policy, i.e. FCFS queues: they stand
for "this assignment, served as vLLM serves it". The oracle needs each task's real outcome on every model,
which only the "alone" runs of this same trace give, so those run first.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.workload.corpus import Problem

WORKFLOW = "code/planner-coder"
ALONE = "alone-"
ORACLE = "oracle"
ROUND_ROBIN = "round-robin"
LEAST_LOADED = "least-loaded"
_TAU = re.compile(r"^(chimera|chimera-plus)-tau(\d+(?:\.\d+)?)$")


@dataclass(frozen=True, slots=True)
class LivePolicy:
    name: str
    dispatcher_policy: str  # CHIMERA_DISPATCHER_POLICY
    tau: float  # CHIMERA_DISPATCHER_TAU (read by chimera and chimera-plus only)
    pin: str  # "": the dispatcher chooses; else ALONE+engine id, ROUND_ROBIN or ORACLE

    @property
    def sim_variant(self) -> str:
        """The ``bench.sweep.sim`` variant making the same decision (pinned ones: FCFS with the same pins)."""
        return "vllm" if self.pin else self.dispatcher_policy


def parse_policy(name: str, engines: Sequence[str]) -> LivePolicy:
    """``alone-<engine id>``, ``oracle``, ``round-robin``, ``least-loaded``, ``chimera-tau<x>``,
    ``chimera-plus-tau<x>``."""
    if name.startswith(ALONE):
        if name.removeprefix(ALONE) not in engines:
            raise ValueError(f"{name}: no engine {name.removeprefix(ALONE)!r} in {list(engines)}")
        return LivePolicy(name, "vllm", 0.0, name)
    if name in (ORACLE, ROUND_ROBIN):
        return LivePolicy(name, "vllm", 0.0, name)
    if name == LEAST_LOADED:
        return LivePolicy(name, "vllm", 0.0, "")
    m = _TAU.match(name)
    if m is None:
        raise ValueError(
            f"unknown policy {name!r}: alone-<engine>, oracle, round-robin, least-loaded, chimera-tau<x>,"
            " chimera-plus-tau<x>"
        )
    return LivePolicy(name, m.group(1), float(m.group(2)), "")


def default_policies(engines: Sequence[str]) -> list[str]:
    """Run order: the alone runs first (the oracle needs their outcomes), then what the must-show compares
    (least-loaded against Chimera's tau sweep), then the oracle and round-robin."""
    return [
        *(f"{ALONE}{e}" for e in engines),
        LEAST_LOADED,
        "chimera-tau2",
        "chimera-tau0.5",
        ORACLE,
        ROUND_ROBIN,
        "chimera-tau8",
        "chimera-plus-tau2",
    ]


def held_out_problems(
    problems: Sequence[Problem], trained_on: set[str], has_check: set[str], n: int, seed: int
) -> list[Problem]:
    """``n`` HumanEval problems the training data never saw, in a seeded order (by numeric id first, so the
    draw does not depend on the corpus's listing order)."""
    pool = [p for p in problems if p.source == "humaneval" and p.id not in trained_on and p.id in has_check]
    pool.sort(key=lambda p: int(p.id.rsplit("/", 1)[1]))
    random.Random(f"live/{seed}").shuffle(pool)
    if len(pool) < n:
        raise ValueError(f"only {len(pool)} held-out HumanEval problems with a check; asked for {n}")
    return pool[:n]


def arrival_offsets(n: int, rate: float, seed: int) -> list[float]:
    """Poisson arrivals at ``rate`` per second: the first at 0, then exponential gaps (seeded)."""
    rng = random.Random(f"arrivals/{seed}")
    out, t = [], 0.0
    for i in range(n):
        if i:
            t += rng.expovariate(rate)
        out.append(round(t, 3))
    return out


def pins(
    policy: LivePolicy,
    n: int,
    engines: Sequence[str],
    models: Mapping[str, str],
    passed: Mapping[str, Sequence[bool]] | None = None,
    fastest_first: Sequence[str] = (),
) -> list[str]:
    """The model each workflow is pinned to ("" for none).

    ``models``: engine id -> model name. ``passed``: engine id -> each task's verified outcome in that
    engine's alone run (the oracle's knowledge); ``fastest_first``: engine ids by measured decode speed.
    The oracle sends a task to the fastest engine whose alone run passed it, else to the strongest engine
    (the best alone pass rate), where it fails anyway.
    """
    if not policy.pin:
        return [""] * n
    if policy.pin.startswith(ALONE):
        return [models[policy.pin.removeprefix(ALONE)]] * n
    if policy.pin == ROUND_ROBIN:
        return [models[engines[i % len(engines)]] for i in range(n)]
    if passed is None or any(len(passed.get(e, ())) != n for e in engines):
        raise ValueError("the oracle needs every engine's alone run of this trace first")
    strongest = max(engines, key=lambda e: (sum(passed[e]), -list(fastest_first).index(e)))
    out = []
    for i in range(n):
        winner = next((e for e in fastest_first if passed[e][i]), strongest)
        out.append(models[winner])
    return out
