"""Documentation generated from the code: the README's key, knob and OpenAI-field tables, and each process's
knob table.

A generated section sits between ``<!-- NAME:start ... -->`` and ``<!-- NAME:end -->`` in a README; the text
around it is written by hand. ``chimera docs --write`` rewrites every section of every README that carries
markers (the top-level one and ``services/<process>/README.md``), and a test fails when one is stale.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from services.cli import knobs
from services.common.keys import KeyDoc, Keys
from services.dispatcher.openai_fields import compat_table

_SECTION = re.compile(r"<!-- ([a-z]+):start")

# Parameter name -> what a key shows in its place. The engine is the hash tag, so ``e`` reads ``{e}``.
PLACEHOLDERS = {
    "engine": "e",
    "request_id": "<id>",
    "program_id": "<program>",
    "kind": "<kind>",
    "tenant": "<tenant>",
    "digest": "<digest>",
}


@dataclass(frozen=True, slots=True)
class KeyRow:
    key: str
    doc: KeyDoc
    meaning: str


def replace_section(text: str, name: str, content: str) -> str:
    """``text`` with whatever lies between the ``name`` markers replaced by ``content``."""
    start_marker, end_marker = f"<!-- {name}:start", f"<!-- {name}:end -->"
    if start_marker not in text or end_marker not in text:
        raise ValueError(f"no {start_marker} ... {end_marker} pair")
    start = text.index("\n", text.index(start_marker)) + 1
    end = text.index(end_marker, start)
    return text[:start] + content + "\n" + text[end:]


def _meaning(fn: Callable[..., str]) -> str:
    summary = (inspect.getdoc(fn) or "").split("\n\n", 1)[0]
    # Docstrings are RST (double backticks); the README is Markdown, where a bare | would split the row.
    return " ".join(line.strip() for line in summary.splitlines()).replace("``", "`").replace("|", "\\|")


def key_rows(keys: Keys | None = None) -> Iterator[KeyRow]:
    """Every ``@key`` method of ``Keys`` in class order, called with placeholder arguments."""
    keys = keys or Keys("chimera")
    for name, fn in vars(Keys).items():
        doc = getattr(fn, "key_doc", None)
        if not isinstance(doc, KeyDoc):
            continue
        params = list(inspect.signature(fn).parameters)[1:]  # after self
        args = [PLACEHOLDERS.get(p, f"<{p}>") for p in params]
        yield KeyRow(getattr(keys, name)(*args), doc, _meaning(fn))


def key_table() -> str:
    lines = ["| key | type | meaning | written by | TTL |", "|---|---|---|---|---|"]
    lines += [
        f"| `{r.key}` | {r.doc.type} | {r.meaning} | {r.doc.written_by} | {r.doc.ttl} |" for r in key_rows()
    ]
    return "\n".join(lines)


def generated(path: Path, name: str, root: Path) -> str:
    """What section ``name`` of the README at ``path`` must hold."""
    if name == "keys":
        return key_table()
    if name == "compat":
        return compat_table()
    if name == "knobs":
        # The top-level README lists every service; a process's README (services/<process>/) only its own.
        return knobs.markdown() if path == root / "README.md" else knobs.service_markdown(path.parent.name)
    raise ValueError(f"{path}: unknown generated section {name!r}")


def readmes(root: Path) -> list[Path]:
    """Every README that may carry generated sections."""
    return [root / "README.md", *sorted(root.glob("services/*/README.md"))]


def sections(path: Path) -> list[str]:
    return _SECTION.findall(path.read_text())


def render(path: Path, root: Path) -> str:
    """The file's text with every generated section as the code makes it now."""
    text = path.read_text()
    for name in sections(path):
        text = replace_section(text, name, generated(path, name, root))
    return text


def stale(root: Path) -> list[Path]:
    return [p for p in readmes(root) if render(p, root) != p.read_text()]


def write_all(root: Path) -> list[Path]:
    """Rewrite every stale README; returns the files changed."""
    changed = stale(root)
    for path in changed:
        path.write_text(render(path, root))
    return changed
