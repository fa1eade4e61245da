"""Numeric answers of the math sets: the model's final number, the reference's, and whether they match.

The solver role ends with ``Answer: <answer>`` (``services.workload.workflows.SOLVER``), so the last such
line that holds a number is read first (the number after its last ``=``, else its first one); then a
LaTeX ``\\boxed{...}``; then the last number anywhere in the text. Numbers may carry thousands separators,
signs, decimals, exponents, ``a/b`` or ``\\frac{a}{b}`` fractions.

Matching: an integer reference must be met exactly (4613732 is not 4613700, whatever the tolerance); a
decimal or fractional one within a relative tolerance, or equal once rounded to the reference's decimal
places (Project Euler prints rounded values).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

_ANSWER_LINE = re.compile(r"(?:final\s+answer|answer)\s*(?:is)?\s*[:=]\s*(?P<rest>[^\n]*)", re.I)
_BOXED = "\\boxed{"
_FRAC = re.compile(r"\\d?frac\{\s*(-?[\d.]+)\s*\}\{\s*(-?[\d.]+)\s*\}")
# A number: sign, digits with optional thousands commas, decimals, exponent, then an optional /denominator.
_NUMBER = re.compile(
    r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?(?![\w])"
    r"|(?<![\w.])-?\.\d+(?![\w])"
)
_PLAIN = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")


@dataclass(frozen=True, slots=True)
class Reference:
    """A reference answer that is a number."""

    value: Fraction
    decimals: int | None  # places of a decimal reference ("0.464399": 6); None for an integer or fraction
    text: str

    @property
    def is_integer(self) -> bool:
        return self.decimals is None and self.value.denominator == 1


def _boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (nested braces matched)."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, i = 1, start + len(_BOXED)
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return text[i:]


def _to_fraction(token: str) -> Fraction | None:
    token = token.replace(",", "").replace(" ", "")
    try:
        if "/" in token:
            num, den = token.split("/", 1)
            d = Fraction(den)
            return None if d == 0 else Fraction(num) / d
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def _numbers(text: str) -> list[str]:
    text = _FRAC.sub(lambda m: f"{m.group(1)}/{m.group(2)}", text.replace("\\!", "").replace("\\,", ""))
    return list(_NUMBER.findall(text.replace("$", " ")))


def last_number(text: str) -> Fraction | None:
    """The last number in ``text``, LaTeX fractions and thousands separators understood."""
    found = _numbers(text)
    return _to_fraction(found[-1]) if found else None


def _stated(line: str) -> Fraction | None:
    """The number an ``Answer:`` line states: the first after its last ``=`` ("17 × 23 = 391"), else its
    first ("391 km (17 km for 23 hours)")."""
    found = _numbers(line.rsplit("=", 1)[-1]) or _numbers(line)
    return _to_fraction(found[0]) if found else None


def final_answer(text: str) -> Fraction | None:
    """The model's final number: the last ``Answer:`` line, else the last ``\\boxed{}``, else the last
    number of the text; None when there is no number at all."""
    lines = _ANSWER_LINE.findall(text)
    for rest in reversed(lines):
        value = _stated(rest)
        if value is not None:
            return value
    boxed = _boxed(text)
    if boxed is not None and (value := last_number(boxed)) is not None:
        return value
    return last_number(text)


def parse_reference(answer: str) -> Reference | None:
    """A dataset's answer as a numeric reference, or None when it is not a number ("2^(n-1)", "No").

    CHAMP writes alternatives ("C(10, 5), or equivalently 252"; "5/14, or approximately 35.7%"): the first
    exact numeric alternative is taken, approximations never.
    """
    for piece in answer.split(", or"):
        piece = piece.strip().removeprefix("equivalently").strip().rstrip(".")
        if _PLAIN.fullmatch(piece) is None:
            continue
        value = _to_fraction(piece)
        if value is None:
            continue
        decimals = len(piece.split(".", 1)[1]) if "." in piece and "/" not in piece else None
        return Reference(value=value, decimals=decimals, text=piece)
    return None


def matches(got: Fraction | None, ref: Reference, rel_tol: float = 1e-4) -> bool:
    """Whether ``got`` is the reference (see the module docstring for the rule)."""
    if got is None:
        return False
    if ref.is_integer:
        return got == ref.value
    if ref.decimals is not None and round(float(got), ref.decimals) == round(float(ref.value), ref.decimals):
        return True
    return math.isclose(float(got), float(ref.value), rel_tol=rel_tol, abs_tol=1e-12)
