"""The paper's six workflow types (§5) and the chat messages of each stage.

A workflow is an ordered list of agent roles; the input of stage i is the role's system prompt, the user task
and the accumulated history of earlier stages (paper §1). ``stage_messages`` builds exactly that and is the
one definition the demo client, the benchmarks and the trace generator share. The role prompts are our own
words: the paper publishes none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.common.tokens import approx_tokens
from services.common.types import ChatMessage


@dataclass(frozen=True, slots=True)
class Role:
    name: str
    system_prompt: str


@dataclass(frozen=True, slots=True)
class Workflow:
    name: str  # "<domain>/<role>-<role>-...", e.g. "code/planner-coder-qa-coder"
    domain: str  # "code" | "math"
    roles: tuple[Role, ...]

    @property
    def n_stages(self) -> int:
        return len(self.roles)


PLANNER = Role(
    "planner",
    "You are the planner in a small team. Read the task and write a short numbered plan: what the input and "
    "output are, the key idea, the steps, and the cases that are easy to get wrong. Do not write the final "
    "solution; the next agent will follow your plan.",
)
CODER = Role(
    "coder",
    "You are a careful Python programmer. Write one complete, runnable Python solution to the task in a "
    "single ```python code block. If a plan or a review precedes you, follow it and fix every issue it "
    "raises. Keep any explanation to a few sentences after the code.",
)
QA_AGENT = Role(
    "qa",
    "You are a QA engineer reviewing a colleague's Python solution. Check it against the task: trace it on "
    "the examples, look for wrong edge cases, off-by-one errors, and complexity that is too high for the "
    "limits. List each concrete problem with a suggested fix, or say clearly that it is correct.",
)
SOLVER = Role(
    "solver",
    "You are a mathematician solving a competition problem. Reason step by step, check each step, and end "
    "with the final answer on its own line as 'Answer: <answer>'. If a plan or a verification precedes "
    "you, use it and correct any error it points out.",
)
VERIFIER = Role(
    "verifier",
    "You are a strict verifier. Re-derive the previous solution independently, check every computation and "
    "the final answer against the problem's conditions, and state either that the answer is correct or "
    "exactly which step is wrong and why.",
)

WORKFLOWS: tuple[Workflow, ...] = (
    Workflow("code/planner-coder-qa-coder", "code", (PLANNER, CODER, QA_AGENT, CODER)),
    Workflow("code/planner-coder", "code", (PLANNER, CODER)),
    Workflow("code/coder", "code", (CODER,)),
    Workflow("math/planner-solver-verifier-solver", "math", (PLANNER, SOLVER, VERIFIER, SOLVER)),
    Workflow("math/planner-solver", "math", (PLANNER, SOLVER)),
    Workflow("math/solver", "math", (SOLVER,)),
)


class UnknownWorkflow(KeyError):
    """No workflow of that name."""


def get_workflow(name: str) -> Workflow:
    for wf in WORKFLOWS:
        if wf.name == name:
            return wf
    raise UnknownWorkflow(f"unknown workflow {name!r}; known: {[w.name for w in WORKFLOWS]}")


def workflows_for(domain: str) -> tuple[Workflow, ...]:
    return tuple(wf for wf in WORKFLOWS if wf.domain == domain)


def stage_messages(
    workflow: Workflow, stage: int, task: str, history: Sequence[str] = ()
) -> tuple[ChatMessage, ...]:
    """The chat messages of stage ``stage`` (0-based): role system prompt, the task, then earlier outputs.

    Earlier stages' outputs are passed back as one user message that names each role, rather than as
    assistant turns: they were written by other agents (and maybe another persona), and a single user turn
    keeps every chat template happy.

    Args:
        workflow: the workflow being run.
        stage: 0-based index of the stage to build.
        task: the user task (the problem text).
        history: the outputs of stages 0..stage-1, in order; exactly ``stage`` of them.
    """
    if not 0 <= stage < workflow.n_stages:
        raise ValueError(f"stage {stage} out of range for {workflow.name} ({workflow.n_stages} stages)")
    if len(history) != stage:
        raise ValueError(f"stage {stage} needs {stage} earlier outputs, got {len(history)}")
    messages = [ChatMessage("system", workflow.roles[stage].system_prompt), ChatMessage("user", task)]
    if history:
        parts = [
            f"### Output of stage {i + 1} ({workflow.roles[i].name})\n{text.strip()}"
            for i, text in enumerate(history)
        ]
        parts.append(f"### Your turn ({workflow.roles[stage].name})\nContinue the work as instructed.")
        messages.append(ChatMessage("user", "\n\n".join(parts)))
    return tuple(messages)


# Chat templates wrap each message in a few special tokens (ChatML: <|im_start|>role\n ... <|im_end|>\n),
# and the generation prompt adds about three more.
TEMPLATE_TOKENS_PER_MESSAGE = 4
TEMPLATE_TOKENS_PER_PROMPT = 3


def approx_prompt_tokens(messages: Sequence[ChatMessage]) -> int:
    """Prompt tokens of a chat request under the project's token proxy (``services.common.tokens``): the texts
    plus the chat template's framing. Used where no engine reported a real count (generated traces)."""
    return (
        sum(approx_tokens(m.content) + TEMPLATE_TOKENS_PER_MESSAGE for m in messages)
        + TEMPLATE_TOKENS_PER_PROMPT
    )
