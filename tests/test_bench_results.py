"""The committed results and what cites them: every result file a README cites exists, and every file under
``bench/results/`` is in its index (``bench/results/INDEX.md``), so no figure points at a file that is gone
and no file lies there without the claim it supports."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "bench" / "results"
INDEX = RESULTS / "INDEX.md"
# `make bench-quick` writes here; it is a smoke run's output, never committed (.gitignore).
UNINDEXED = ("quick",)
CITED = re.compile(r"bench/results/[\w./{},*-]*")


def readmes() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "bench").rglob("README.md")),
        *sorted((ROOT / "services").rglob("README.md")),
    ]


def expand(cited: str) -> list[str]:
    """``a_{1,4}.md`` -> ``a_1.md``, ``a_4.md``: the READMEs name file pairs that way."""
    parts = re.split(r"\{([^{}]*)\}", cited)
    options = [p.split(",") if i % 2 else [p] for i, p in enumerate(parts)]
    return ["".join(o) for o in itertools.product(*options)]


def citations(text: str) -> set[str]:
    out = set()
    for match in CITED.findall(text):
        path = match.rstrip(".,;:")
        first = path.removeprefix("bench/results/").split("/")[0]
        if first and first not in UNINDEXED:
            out.update(expand(path))
    return out


def exists(rel: str) -> bool:
    if "*" in rel:
        return any(ROOT.glob(rel))
    return (ROOT / rel).exists()


@pytest.mark.parametrize("path", readmes(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_result_a_readme_cites_exists(path: Path) -> None:
    missing = sorted(c for c in citations(path.read_text()) if not exists(c))
    assert missing == [], f"{path.relative_to(ROOT)} cites missing results: {missing}"


def indexed() -> set[str]:
    """The names in the first column of the index's tables (files, or folders ending in ``/``)."""
    names: set[str] = set()
    for line in INDEX.read_text().splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([^`]+)`", line.split(" | ")[0]))
    return names


def test_every_file_under_results_is_in_the_index() -> None:
    names = indexed()
    folders = {n for n in names if n.endswith("/")}
    unlisted = []
    for path in sorted(RESULTS.rglob("*")):
        rel = path.relative_to(RESULTS).as_posix()
        if path.is_dir() or path == INDEX or rel.split("/")[0] in UNINDEXED:
            continue
        if rel not in names and not any(rel.startswith(f) for f in folders):
            unlisted.append(rel)
    assert unlisted == [], f"bench/results/INDEX.md does not list: {unlisted}"


def test_every_file_the_index_lists_exists() -> None:
    assert len(indexed()) > 40
    missing = sorted(n for n in indexed() if not (RESULTS / n).exists())
    assert missing == [], f"bench/results/INDEX.md lists missing files: {missing}"


def test_the_citation_reader_expands_pairs_and_drops_punctuation() -> None:
    text = "see `bench/results/overhead_stream_{1,4}.md`, and bench/results/load.md."
    assert citations(text) == {
        "bench/results/overhead_stream_1.md",
        "bench/results/overhead_stream_4.md",
        "bench/results/load.md",
    }
