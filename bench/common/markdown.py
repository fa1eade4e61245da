"""Markdown for the benchmark reports."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A pipe table's lines: header, rule, one line per row (cells already formatted)."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]
