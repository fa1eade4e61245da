"""``chimera``: run the stack, the demo, training and inspection commands."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from services.cli import keys, tenants, train
from services.cli.collect import collect
from services.cli.profile import profile
from services.common.logs import setup_logging
from services.inspect.cli import app as inspect_app
from services.launcher.config import REAL_TRACES, LauncherSettings
from services.launcher.stack import running_stack

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
app.add_typer(train.app, name="train")
app.add_typer(keys.app, name="keys")
app.add_typer(tenants.app, name="tenants")
app.add_typer(inspect_app)
app.command()(profile)
app.command()(collect)
# Wide enough for the demo's tables when stdout is not a terminal (CI logs, pipes).
console = Console(width=180)

PoolOpt = Annotated[
    Path | None, typer.Option("--pool", help="pool YAML, or an embedded pool: vllm-cpu (default), simulated")
]


def _settings(pool: Path | None, **overrides: object) -> LauncherSettings:
    base = LauncherSettings()
    changes = {k: v for k, v in overrides.items() if v is not None}
    if pool is not None:
        changes["pool_file"] = pool
    return base.model_copy(update=changes)


@app.command()
def up(
    pool: PoolOpt = None,
    inference: Annotated[
        str | None,
        typer.Option(
            help="remote: router and predictor services; inline: the dispatcher runs their CPU models "
            "(CHIMERA_UP_INFERENCE)"
        ),
    ] = None,
) -> None:
    """Start Redis (private unless CHIMERA_REDIS_URL is set), router and predictor (unless inline), workers
    and dispatcher; stop them all on Ctrl-C or SIGTERM."""
    if inference not in (None, "remote", "inline"):
        raise typer.BadParameter(f"{inference!r}: remote or inline", param_hint="--inference")
    setup_logging("launcher")
    settings = _settings(pool, inference=inference)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with running_stack(settings) as stack:
        console.print(
            f"[bold green]chimera is up[/]: gRPC front door {', '.join(stack.dispatcher_addrs)}, "
            f"redis {stack.redis_url}, engines {[e.id for e in stack.pool.engines]}; logs in "
            f"{stack.state_dir / 'logs'}"
        )
        stop.wait()
        console.print("stopping…")


@app.command()
def demo(
    pool: PoolOpt = None,
    workflows: Annotated[int, typer.Option(help="tasks, each run by every arm")] = 8,
    max_tokens: Annotated[int, typer.Option(help="max tokens per stage (the real traces' budget)")] = 512,
    workflow: Annotated[
        str, typer.Option(help="workflow type (services/workload/workflows.py)")
    ] = "code/coder",
    compare: Annotated[
        bool, typer.Option(help="also run each model alone on the same tasks, beside Chimera's choice")
    ] = True,
    policy: Annotated[
        str | None,
        typer.Option(help="the dispatcher's policy (CHIMERA_DISPATCHER_POLICY; services/policy/README.md)"),
    ] = None,
    tau: Annotated[
        float | None,
        typer.Option(help="the dispatcher's latency slack (CHIMERA_DISPATCHER_TAU); unset: its setting"),
    ] = None,
    seed: int = 0,
    agent: Annotated[
        bool,
        typer.Option(
            help="run the coding agent instead (services/agent): the official OpenAI client over the HTTP"
            " door, no Chimera header, a run_tests tool that runs the problem's tests, up to --max-turns"
        ),
    ] = False,
    max_turns: Annotated[int, typer.Option(help="the coding agent's turn limit (with --agent)")] = 4,
) -> None:
    """Bring the stack up on free ports, run HumanEval workflows through the gRPC front door as Chimera
    routes them and as each model alone serves them, verify every answer, print the comparison, and stop.
    With --agent, the same tasks as tool-using agent loops over the OpenAI door."""
    from services.demo.arms import arms_for, demo_tasks, run_arms, seen_problems
    from services.demo.report import print_arms, print_report
    from services.dispatcher.config import DispatcherSettings
    from services.policy.registry import POLICIES
    from services.verify.answers import load_answer_key
    from services.workload.corpus import load_corpus
    from services.workload.workflows import UnknownWorkflow, get_workflow

    setup_logging("demo", "WARNING")
    logging.getLogger("services.launcher").setLevel(logging.INFO)
    try:
        wf = get_workflow(workflow)
    except UnknownWorkflow as exc:
        raise typer.BadParameter(str(exc), param_hint="--workflow") from None
    if policy is not None and policy not in POLICIES:
        raise typer.BadParameter(f"unknown policy; known: {sorted(POLICIES)}", param_hint="--policy")
    overrides: dict[str, Any] = {k: v for k, v in (("policy", policy), ("tau", tau)) if v is not None}
    corpus = load_corpus()
    console.print(f"corpus: {len(corpus.problems)} problems from {corpus.origin} {corpus.counts()}")
    key = load_answer_key()
    console.print(f"answer key: checks for {key.counts()} (verified scores go back with EndProgram)")
    settings = _settings(pool, dispatcher_port=0, http_port=0, router_port=0, predictor_port=0)
    tasks = demo_tasks(corpus.problems, key, wf, workflows, seed, exclude=seen_problems(settings.real_traces))
    console.print(
        f"tasks: {len(tasks)} HumanEval problems as {wf.name}, none of them in the real traces the router"
        f" learnt from; {max_tokens} tokens per stage"
    )
    chosen = DispatcherSettings(**overrides)  # what the dispatcher child will run with
    console.print(
        f"Chimera's policy: {chosen.policy}, tau {chosen.tau:g} (latency slack), delta {chosen.delta_s:g}"
        " (confidence margin)"
    )
    dispatcher_env = {f"CHIMERA_DISPATCHER_{k.upper()}": str(v) for k, v in overrides.items()}
    with running_stack(settings, dispatcher_env=dispatcher_env) as stack:
        console.print(f"stack up: engines {[f'{e.id} ({e.model})' for e in stack.pool.engines]}")
        models = list(dict.fromkeys(e.model for e in stack.pool.engines))
        arms = arms_for(models if compare else [])
        if agent:
            from services.agent.demo import print_agent_arms, run_agent_arms

            # Alone, only a model that can call tools can run the loop; Chimera routes it to those only.
            arms = arms_for(list(stack.pool.tool_models) if compare else [])
            loops = asyncio.run(run_agent_arms(console, stack, arms, tasks, key, max_turns, max_tokens))
            print_agent_arms(console, loops)
            raise typer.Exit(1 if any(r.error for runs in loops.values() for r in runs) else 0)
        results = asyncio.run(run_arms(console, stack, arms, wf, tasks, max_tokens, key))
    everything = [r for runs in results.values() for r in runs]
    print_report(console, everything)
    print_arms(console, results)
    failed = sum(not r.completed for r in everything)
    raise typer.Exit(1 if failed else 0)


@app.command()
def knobs(
    write: Annotated[Path | None, typer.Option(help="rewrite the table inside this README instead")] = None,
) -> None:
    """Print every configuration knob (environment variable, default, meaning) as a Markdown table."""
    from services.cli.docs import replace_section
    from services.cli.knobs import markdown

    if write is not None:
        write.write_text(replace_section(write.read_text(), "knobs", markdown()))
    else:
        typer.echo(markdown())


@app.command()
def docs(
    write: Annotated[bool, typer.Option(help="rewrite the stale sections instead of listing them")] = False,
    root: Annotated[Path, typer.Option(help="repository root")] = Path("."),
) -> None:
    """Check (or with --write, rewrite) the README sections generated from the code: the key table from
    services/common/keys.py and the knob tables from the settings classes. Exits 1 when one is stale."""
    from services.cli.docs import stale, write_all

    if write:
        for path in write_all(root):
            typer.echo(f"rewrote {path}")
        return
    paths = stale(root)
    for path in paths:
        typer.echo(f"stale: {path} (run `chimera docs --write`)")
    raise typer.Exit(1 if paths else 0)


@app.command()
def bootstrap(
    model: Annotated[
        list[str], typer.Option(help="a served model, as NAME or NAME=PAPER_MODEL (its stand-in); repeat")
    ],
    artifacts: Annotated[Path, typer.Option(help="artifacts root (router/ and predictor/ under it)")] = Path(
        ".chimera/artifacts"
    ),
    workflows: Annotated[int, typer.Option(help="synthetic workflows per model")] = 3000,
    seed: int = 0,
    real_traces: Annotated[
        Path | None, typer.Option(help="real verified traces to learn from for the models they cover")
    ] = REAL_TRACES,
) -> None:
    """Train first router and predictor artifacts: on real verified traces for the models they cover, on
    synthetic stand-ins for the rest (skipped when current artifacts already cover every model and are not
    a bootstrap trained on less). Compose runs this once before the router and predictor."""
    from services.launcher.bootstrap import ensure_artifacts
    from services.launcher.pool import EngineSpec, PoolSpec

    setup_logging("bootstrap")
    engines = []
    for i, item in enumerate(model):
        name, _, stand_in = item.partition("=")
        engines.append(EngineSpec(id=f"m{i}", model=name, stand_in=stand_in or None))
    dirs = ensure_artifacts(
        PoolSpec(engines=tuple(engines)), artifacts, workflows, seed, real_folder=real_traces
    )
    console.print(f"artifacts ready: {dirs.router}, {dirs.predictor}")


if __name__ == "__main__":
    app()
