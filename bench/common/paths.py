"""The folders every benchmark reads and writes, named once so a module's place in ``bench/`` does not
decide where its results go."""

from __future__ import annotations

import subprocess
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
RESULTS = BENCH / "results"  # committed results; INDEX.md lists each file and the claim it supports
DATA = BENCH / "data"
CACHE = BENCH / ".cache"  # the sweep's trained models and generated jobs (not committed)


def dataset_commit(folder: Path) -> str | None:
    """The last commit that changed ``folder``: a result names the data it was computed from."""
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%H", "--", str(folder)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return out or None
