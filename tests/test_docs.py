"""The READMEs' generated sections (key table, knob tables) are exactly what the code produces now."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from services.cli import docs
from services.cli.knobs import SETTINGS, knobs
from services.common.keys import KeyDoc, Keys

pytestmark = pytest.mark.unit

ROOT = Path(__file__).parents[1]
PROCESSES = ("router", "predictor", "dispatcher", "worker", "jobs")


@pytest.mark.parametrize("path", docs.readmes(ROOT), ids=lambda p: str(p.relative_to(ROOT)))
def test_generated_sections_match_the_code(path: Path) -> None:
    for name in docs.sections(path):
        want = docs.replace_section(path.read_text(), name, docs.generated(path, name, ROOT))
        assert path.read_text() == want, (
            f"the {name} section of {path.relative_to(ROOT)} is stale: run `chimera docs --write`"
        )


def test_the_top_readme_and_every_process_readme_carry_their_sections() -> None:
    assert set(docs.sections(ROOT / "README.md")) >= {"keys", "knobs"}
    for process in PROCESSES:
        assert "knobs" in docs.sections(ROOT / "services" / process / "README.md"), process


def test_every_process_with_a_readme_has_a_settings_class() -> None:
    services = {s for s, _, _ in SETTINGS}
    assert set(PROCESSES) <= services


def test_replace_section_touches_only_the_text_between_its_markers() -> None:
    page = (
        "intro\n<!-- a:start (generated) -->\n{a}\n<!-- a:end -->\n<!-- b:start -->\nkeep\n<!-- b:end -->\n"
    )
    out = docs.replace_section(page.format(a="old"), "a", "new\nrows")
    assert out == page.format(a="new\nrows")
    with pytest.raises(ValueError):
        docs.replace_section(out, "c", "x")


def test_the_key_table_lists_every_marked_key_in_class_order() -> None:
    marked = [n for n, fn in vars(Keys).items() if isinstance(getattr(fn, "key_doc", None), KeyDoc)]
    rows = list(docs.key_rows())
    assert len(rows) == len(marked) > 0
    assert [r.key for r in rows] == [getattr(Keys("chimera"), n)(*_args(n)) for n in marked]
    assert "program_pattern" not in marked  # a SCAN pattern, not a key


def _args(name: str) -> list[str]:
    params = list(inspect.signature(getattr(Keys, name)).parameters)[1:]
    return [docs.PLACEHOLDERS[p] for p in params]


def test_keys_read_with_placeholders() -> None:
    keys = {r.key for r in docs.key_rows()}
    assert {
        "chimera:engines",
        "chimera:{e}:queue",
        "chimera:{e}:req:<id>",
        "chimera:prog:<program>",
        "chimera:{jobs}:retrain:<kind>:lock",
    } <= keys


def test_meaning_is_the_docstring_summary_in_markdown() -> None:
    by_key = {r.key: r for r in docs.key_rows()}
    info = by_key["chimera:{e}:info"]
    assert info.meaning.startswith("Model, profile, `max_num_seqs`")  # RST ``x`` became Markdown `x`
    assert "``" not in info.meaning and "\n" not in info.meaning
    assert "O(1)" not in info.meaning  # later paragraphs stay in keys.py
    assert "router \\| predictor" in by_key["chimera:{jobs}:retrain:<kind>:lock"].meaning


def test_a_process_table_holds_its_own_knobs_and_not_the_shared_ones() -> None:
    table = docs.generated(ROOT / "services" / "worker" / "README.md", "knobs", ROOT)
    own = [k.env for k in knobs() if k.service == "worker"]
    assert all(f"`{env}`" in table for env in own)
    assert "`CHIMERA_REDIS_URL`" not in table and "`CHIMERA_DISPATCHER_PORT`" not in table
