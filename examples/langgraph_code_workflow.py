"""The paper's code workflow (Planner -> Coder -> QA -> Coder) as a LangGraph graph served by Chimera.

Run ``chimera up`` in one terminal, then one of::

    .venv/bin/python examples/langgraph_code_workflow.py                     # gRPC SDK (ChimeraChatModel)
    .venv/bin/python examples/langgraph_code_workflow.py --http http://127.0.0.1:8000/v1 --stream

The graph knows nothing about Chimera: ``instrument`` makes each run one program, every model call in it
the next stage, and sends the outcome the last node writes into the state (does the code parse?) with
EndProgram. Printed per stage: the model and engine Chimera chose, and the queue wait.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
from typing import Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

from chimera_client.langchain import ChimeraChatModel
from chimera_client.langgraph import http_clients, instrument
from chimera_client.program import ProgramRun

WORKFLOW = "code/planner-coder-qa-coder"
TASK = "Write a Python function `is_palindrome(s: str) -> bool` that ignores case and non-letters."
_FENCE = re.compile(r"```(?:python)?\n(.*?)```", re.DOTALL)


class CodeState(TypedDict, total=False):
    task: str
    plan: str
    code: str
    review: str
    outcome: float


def parses(text: str) -> bool:
    blocks = _FENCE.findall(text)
    try:
        ast.parse(blocks[0] if blocks else text)
    except SyntaxError:
        return False
    return True


def build(llm: BaseChatModel) -> Any:
    """The four agents as graph nodes; each one is a model call, so each one is a stage."""

    def ask(system: str, *turns: tuple[str, str]) -> str:
        return str(llm.invoke([("system", system), *turns]).text)

    def planner(s: CodeState) -> CodeState:
        return {"plan": ask("You are a planner. List the steps, briefly.", ("user", s["task"]))}

    def coder(s: CodeState) -> CodeState:
        turns = [("user", s["task"]), ("assistant", s["plan"]), ("user", "Write the code.")]
        return {"code": ask("You are a coder. Answer with one Python code block.", *turns)}

    def qa(s: CodeState) -> CodeState:
        turns = [("user", s["task"]), ("assistant", s["code"]), ("user", "Review the code.")]
        return {"review": ask("You are QA. Point out bugs and missing cases.", *turns)}

    def fixer(s: CodeState) -> CodeState:
        fix = f"A reviewer says:\n{s['review']}\nFix the code."
        turns = [("user", s["task"]), ("assistant", s["code"]), ("user", fix)]
        code = ask("You are a coder. Answer with one Python code block.", *turns)
        return {"code": code, "outcome": 1.0 if parses(code) else 0.0}  # the graph reports its outcome

    g = StateGraph(CodeState)
    g.add_node("planner", planner)
    g.add_node("coder", coder)
    g.add_node("qa", qa)
    g.add_node("fixer", fixer)
    g.add_edge(START, "planner")
    g.add_edge("planner", "coder")
    g.add_edge("coder", "qa")
    g.add_edge("qa", "fixer")
    g.add_edge("fixer", END)
    return g.compile(name=WORKFLOW)


def chat_model(addr: str, http: str | None, max_tokens: int) -> BaseChatModel:
    if http:  # langchain-openai's own chat model on the HTTP door
        key = os.environ.get("CHIMERA_API_KEY", "unused")
        return ChatOpenAI(
            base_url=http, api_key=key, model="auto", max_tokens=max_tokens, temperature=0, **http_clients()
        )
    return ChimeraChatModel(addr=addr, max_tokens=max_tokens)


def report(run: ProgramRun) -> None:
    sys.stdout.write(f"program {run.program_id} ({run.workflow}), outcome {run.outcome}\n")
    for s in run.stages:
        wait = "-" if s.queue_wait_s is None else f"{s.queue_wait_s:.3f}s"
        sys.stdout.write(f"  stage {s.stage}: {s.model} on {s.engine}, queue wait {wait}\n")


def run(addr: str, http: str | None = None, max_tokens: int = 256, stream: bool = False) -> ProgramRun:
    """One run of the graph; returns its program (stages and outcome) after printing it."""
    runs: list[ProgramRun] = []
    g = instrument(build(chat_model(addr, http, max_tokens)), addr=addr, on_end=runs.append)
    if stream:  # tokens as they come ("messages"), and the state after each node ("values")
        for mode, chunk in g.stream({"task": TASK}, stream_mode=["messages", "values"]):
            if mode == "messages":
                sys.stdout.write(str(chunk[0].text))
        sys.stdout.write("\n")
    else:
        g.invoke({"task": TASK})
    report(runs[0])
    return runs[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--addr", default="127.0.0.1:50051", help="dispatcher gRPC address (also ends programs)")
    p.add_argument("--http", default=None, help="use ChatOpenAI on this HTTP base URL (…/v1) instead")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--stream", action="store_true", help="stream tokens")
    args = p.parse_args(argv)
    run(args.addr, args.http, args.max_tokens, args.stream)
    return 0


if __name__ == "__main__":
    sys.exit(main())
