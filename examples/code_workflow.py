"""A planner -> coder -> QA -> coder workflow through Chimera's async SDK.

Run ``chimera up`` in one terminal, then::

    .venv/bin/python examples/code_workflow.py --addr 127.0.0.1:50051

All four stages carry one program id, so the dispatcher keeps them on one model (the context lives there).
The final code is verified by running tests against it in Chimera's sandbox (``services.verify``: a
temporary folder, time, CPU and memory limits, no network), and that score goes back with EndProgram as a
training label for the router.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from services.sdk import AsyncClient, Completion, Sampling
from services.verify.checks import HumanEvalCheck
from services.verify.verifier import verify

TASK = "Write a Python function `is_palindrome(s: str) -> bool` that ignores case and non-letters."
# The task as a HumanEval-style check: the signature the answer must define and the tests it must pass.
CHECK = HumanEvalCheck(
    prompt="def is_palindrome(s: str) -> bool:\n    ...\n",
    test=(
        "def check(candidate):\n"
        "    assert candidate('A man, a plan, a canal: Panama')\n"
        "    assert candidate('No lemon, no melon')\n"
        "    assert candidate('')\n"
        "    assert not candidate('Chimera')\n"
        "    assert not candidate('ab1a2b')\n"
    ),
    entry_point="is_palindrome",
)


async def run(addr: str, model: str = "auto", max_tokens: int = 256) -> float:
    """Run one workflow; returns its outcome (1.0 if the final code passes the tests)."""
    sampling = Sampling(max_tokens=max_tokens, temperature=0.0)
    async with AsyncClient(addr) as client, client.workflow("code/planner-coder-qa-coder", model=model) as wf:
        plan = await wf.run_stage(
            [("system", "You are a planner. List the steps, briefly."), ("user", TASK)], sampling=sampling
        )
        history = [("user", TASK), ("assistant", plan.text)]
        sys.stdout.write(f"[{wf.program_id}] plan on {plan.model} ({plan.completion_tokens} tokens)\n")
        code = ""
        async for ev in wf.stream_stage(
            [
                ("system", "You are a coder. Answer with one Python code block."),
                *history,
                ("user", "Write the code."),
            ],
            sampling=sampling,
        ):
            if isinstance(ev, Completion):
                code = ev.text  # the Completion: the text of the attempt that won
            else:
                sys.stdout.write(ev.text)
        sys.stdout.write("\n")
        review = await wf.run_stage(
            [
                ("system", "You are QA. Point out bugs and missing cases."),
                *history,
                ("assistant", code),
                ("user", "Review the code."),
            ],
            sampling=sampling,
        )
        fixed = await wf.run_stage(
            [
                ("system", "You are a coder. Answer with one Python code block."),
                *history,
                ("assistant", code),
                ("user", f"A reviewer says:\n{review.text}\nFix the code."),
            ],
            sampling=sampling,
        )
        # The sandbox runs a child interpreter: off the event loop.
        verdict = await asyncio.to_thread(verify, CHECK, fixed.text)
        outcome = verdict.score
        wf.set_outcome(outcome)
        sys.stdout.write(
            f"[{wf.program_id}] {len(wf.completions)} stages on {fixed.model}/{fixed.engine}, "
            f"last queue wait {fixed.queue_wait_s:.3f}s; verified: {verdict.detail}; outcome {outcome}\n"
        )
    return outcome


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--addr", default="127.0.0.1:50051", help="dispatcher gRPC address")
    p.add_argument("--model", default="auto", help='"auto" or a model name to pin')
    p.add_argument("--max-tokens", type=int, default=256)
    args = p.parse_args(argv)
    asyncio.run(run(args.addr, args.model, args.max_tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
