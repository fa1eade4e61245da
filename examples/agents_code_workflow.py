"""The paper's code workflow (Planner -> Coder -> QA -> Coder) as an OpenAI Agents SDK run served by Chimera.

Run ``chimera up`` in one terminal, then::

    .venv/bin/python examples/agents_code_workflow.py [--stream]

Four agents hand off to one another; the run is one Chimera program and each agent's model call its next
stage. A handoff is forced by the agent's ``tool_choice`` (the engines write text; they do not pick tools).
Printed per stage: the model and engine Chimera chose, and the queue wait.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import re
import sys

from agents import Agent, ModelSettings, Runner

from chimera_client.agents import ChimeraModelProvider
from chimera_client.program import ProgramRun
from chimera_client.types import Sampling

WORKFLOW = "code/planner-coder-qa-coder"
TASK = "Write a Python function `is_palindrome(s: str) -> bool` that ignores case and non-letters."
ROLES = (
    ("planner", "You are a planner. List the steps, briefly."),
    ("coder", "You are a coder. Answer with one Python code block."),
    ("qa", "You are QA. Point out bugs and missing cases in the code above."),
    ("fixer", "You are a coder. Fix the code above; answer with one Python code block."),
)
_FENCE = re.compile(r"```(?:python)?\n(.*?)```", re.DOTALL)


def chain(roles: tuple[tuple[str, str], ...] = ROLES) -> Agent[None]:
    """Agents that hand off in the given order; returns the first. Each but the last must hand off."""
    nxt: Agent[None] | None = None
    for name, instructions in reversed(roles):
        if nxt is None:
            nxt = Agent(name=name, instructions=instructions)
        else:
            settings = ModelSettings(tool_choice=f"transfer_to_{nxt.name}")
            nxt = Agent(name=name, instructions=instructions, handoffs=[nxt], model_settings=settings)
    assert nxt is not None
    return nxt


def parses(text: str) -> bool:
    blocks = _FENCE.findall(text)
    try:
        ast.parse(blocks[0] if blocks else text)
    except SyntaxError:
        return False
    return True


def report(run: ProgramRun) -> None:
    sys.stdout.write(f"program {run.program_id} ({run.workflow}), outcome {run.outcome}\n")
    for s in run.stages:
        sys.stdout.write(f"  stage {s.stage}: {s.model} on {s.engine}, queue wait {s.queue_wait_s:.3f}s\n")


async def run(
    addr: str,
    max_tokens: int = 256,
    stream: bool = False,
    roles: tuple[tuple[str, str], ...] = ROLES,
    workflow: str = WORKFLOW,
) -> ProgramRun:
    """One run of the agents; returns its program (stages and outcome) after printing it."""
    sampling = Sampling(max_tokens=max_tokens)
    async with ChimeraModelProvider(workflow, addr=addr, sampling=sampling) as chimera:
        config = chimera.run_config(tracing_disabled=True)  # no trace export: nothing to send it to
        if stream:
            streamed = Runner.run_streamed(chain(roles), TASK, run_config=config)
            async for event in streamed.stream_events():
                if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
                    sys.stdout.write(event.data.delta)
            sys.stdout.write("\n")
            final = str(streamed.final_output)
        else:
            final = str((await Runner.run(chain(roles), TASK, run_config=config)).final_output)
        chimera.set_outcome(1.0 if parses(final) else 0.0)
    report(chimera.run)
    return chimera.run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--addr", default="127.0.0.1:50051", help="dispatcher gRPC address")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--stream", action="store_true", help="stream tokens")
    args = p.parse_args(argv)
    asyncio.run(run(args.addr, args.max_tokens, args.stream))
    return 0


if __name__ == "__main__":
    sys.exit(main())
