"""A planner -> solver workflow through Chimera's blocking SDK.

Run ``chimera up`` in one terminal, then::

    .venv/bin/python examples/math_workflow.py --addr 127.0.0.1:50051

The solver sees the planner's plan; its final number is matched against the answer by Chimera's numeric
verifier (``services.verify.numeric``) and the score goes back with EndProgram as a training label.
"""

from __future__ import annotations

import argparse
import sys
from fractions import Fraction

from services.sdk import Client, Sampling
from services.verify.checks import NumericCheck
from services.verify.numeric import Reference, final_answer
from services.verify.verifier import verify

PROBLEM = (
    "A train travels 17 km every hour for 23 hours. How many km does it travel? "
    "End with the final answer on its own line as 'Answer: <number>'."
)
ANSWER = 17 * 23
CHECK = NumericCheck(Reference(value=Fraction(ANSWER), decimals=None, text=str(ANSWER)))


def run(addr: str, model: str = "auto", max_tokens: int = 256) -> float:
    """Run one workflow; returns its outcome (1.0 if the verified answer is right)."""
    sampling = Sampling(max_tokens=max_tokens, temperature=0.0)
    with Client(addr) as client, client.workflow("math/planner-solver", model=model) as wf:
        plan = wf.run_stage(
            [("system", "Plan the solution; do not solve."), ("user", PROBLEM)], sampling=sampling
        )
        solution = wf.run_stage(
            [
                ("system", "Follow the plan; end with 'Answer: <number>' on its own line."),
                ("user", PROBLEM),
                ("assistant", plan.text),
                ("user", "Solve it."),
            ],
            sampling=sampling,
        )
        outcome = verify(CHECK, solution.text).score
        answer = final_answer(solution.text)
        wf.set_outcome(outcome)
        sys.stdout.write(
            f"[{wf.program_id}] {len(wf.completions)} stages on {solution.model}/{solution.engine}; "
            f"answer {answer} (expected {ANSWER}); outcome {outcome}\n"
        )
    return outcome


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--addr", default="127.0.0.1:50051", help="dispatcher gRPC address")
    p.add_argument("--model", default="auto", help='"auto" or a model name to pin')
    p.add_argument("--max-tokens", type=int, default=256)
    args = p.parse_args(argv)
    run(args.addr, args.model, args.max_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
