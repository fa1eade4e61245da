"""The README documents every configuration knob that the code reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cli.knobs import knobs

pytestmark = pytest.mark.unit


def test_readme_names_every_knob() -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    missing = [k.env for k in knobs() if f"`{k.env}`" not in readme]
    assert missing == [], f"README lacks these knobs (run `chimera docs --write`): {missing}"


def test_every_knob_has_a_description() -> None:
    undocumented = [k.env for k in knobs() if not k.description]
    assert undocumented == []
