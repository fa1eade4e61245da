"""Find the program in a model's markdown answer.

Models wrap code in fences of every flavour (```python, ```py, ```Python3, bare ```, ~~~), put prose, example
runs and shell commands in other fences, stop mid-block when ``max_tokens`` runs out, or answer with bare
code. ``extract_code`` takes the block most likely to be the solution: among the Python-looking blocks, the
last one that defines the wanted function (a final stage usually ends with the corrected version), else the
last one that parses, else the longest; with no fence at all, the longest stretch of the text that parses.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

# An opening fence, its language tag, the body, and a closing fence or the end of the text (truncated).
_FENCE = re.compile(
    r"^[ \t]*(?P<fence>```+|~~~+)[ \t]*(?P<lang>[\w+.#-]*)[^\n]*\n"
    r"(?P<body>.*?)(?:^[ \t]*(?P=fence)[ \t]*$|\Z)",
    re.M | re.S,
)
_PYTHON_TAGS = {"", "python", "py", "python3", "py3", "ipython", "pycon"}
_CODE_START = re.compile(r"^(?:def |class |import |from |async def |@)", re.M)


@dataclass(frozen=True, slots=True)
class Block:
    lang: str
    code: str

    def parses(self) -> bool:
        return _parses(self.code)

    def defines(self, name: str) -> bool:
        return defines(self.code, name)


def defines(code: str, name: str) -> bool:
    """Whether ``code`` has a ``def`` or ``class`` of that name (at any indentation)."""
    return re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b", code, re.M) is not None


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def code_blocks(text: str) -> list[Block]:
    """Every fenced block of ``text`` in order, with its language tag in lower case."""
    return [Block(m.group("lang").lower(), m.group("body")) for m in _FENCE.finditer(text)]


def _strip_console(code: str) -> str:
    """A ``>>>`` session as the program it shows (doctest-style answers)."""
    lines = code.splitlines()
    if not any(line.startswith(">>> ") for line in lines):
        return code
    kept = [line[4:] for line in lines if line.startswith((">>> ", "... "))]
    return "\n".join(kept) + "\n"


def _bare_code(text: str) -> str:
    """With no fence: from the first line that starts a definition or import, the longest prefix that
    parses (trailing prose dropped line by line)."""
    start = _CODE_START.search(text)
    if start is None:
        return text if _parses(text) else ""
    lines = text[start.start() :].splitlines()
    for end in range(len(lines), 0, -1):
        candidate = "\n".join(lines[:end]) + "\n"
        if _parses(candidate):
            return candidate
    return ""


def extract_code(text: str, wanted: str | None = None) -> str:
    """The solution program in ``text`` ("" when there is none).

    Args:
        text: a model's answer (markdown).
        wanted: a function or class name the solution must define (HumanEval's entry point, LeetCode's
            ``Solution``); blocks that define it win.
    """
    blocks = [
        Block(b.lang, _strip_console(b.code))
        for b in code_blocks(text)
        if b.lang in _PYTHON_TAGS and b.code.strip()
    ]
    if not blocks:
        return _bare_code(text)
    if wanted is not None:
        defining = [b for b in blocks if b.defines(wanted)]
        parsing = [b for b in defining if b.parses()]
        if parsing or defining:
            return (parsing or defining)[-1].code
    parsing = [b for b in blocks if b.parses()]
    if parsing:
        return parsing[-1].code
    return max(blocks, key=lambda b: len(b.code)).code
