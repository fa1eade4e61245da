"""Verify a model's final answer to a corpus problem: the one entry point the demo and examples call."""

from __future__ import annotations

from services.verify.answers import AnswerKey
from services.verify.checks import Check, HumanEvalCheck, LeetCodeCheck, NumericCheck, Verdict
from services.verify.code import verify_humaneval, verify_leetcode
from services.verify.config import VerifySettings
from services.verify.numeric import final_answer, matches
from services.verify.sandbox import Limits


def verify_numeric(check: NumericCheck, answer: str, rel_tol: float = 1e-4) -> Verdict:
    got = final_answer(answer)
    ref = check.reference
    if matches(got, ref, rel_tol):
        return Verdict("numeric", 1.0, f"answer {ref.text}")
    shown = "none" if got is None else (str(got) if got.denominator == 1 else f"{float(got):.6g}")
    return Verdict("numeric", 0.0, f"answer {shown}, expected {ref.text}")


def verify(check: Check, answer: str, settings: VerifySettings | None = None) -> Verdict:
    """Run ``check`` on ``answer`` (code in the sandbox, numbers matched); blocking: code checks start a
    child interpreter, so async callers hand this to a thread."""
    settings = settings or VerifySettings()
    if isinstance(check, NumericCheck):
        return verify_numeric(check, answer, settings.float_rel_tol)
    limits = Limits.from_settings(settings)
    if isinstance(check, HumanEvalCheck):
        return verify_humaneval(check, answer, limits)
    if isinstance(check, LeetCodeCheck):
        return verify_leetcode(check, answer, limits)
    raise TypeError(f"unknown check {type(check).__name__}")


def verify_problem(
    key: AnswerKey, problem_id: str, answer: str, settings: VerifySettings | None = None
) -> Verdict | None:
    """The verdict on ``answer`` to ``problem_id``, or None when the key has no check for that problem."""
    check = key.get(problem_id)
    return None if check is None else verify(check, answer, settings)
