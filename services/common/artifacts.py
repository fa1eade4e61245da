"""Versioned model artifacts on disk, with an atomic ``CURRENT`` pointer for hot reload.

Layout of one kind's directory (``<root>/router``, ``<root>/predictor``)::

    <version>.joblib   the fitted backend object
    <version>.json     metadata: kind, backend, created, data hash, row count, models, metrics
    CURRENT            the version being served (one line)

NOTE(atomicity): every file is written to a temporary name in the same directory and renamed into place, and
``CURRENT`` is written last, so a reader that sees a version in ``CURRENT`` always finds both of its files
complete. Versions are never rewritten, so a process that loaded one never sees it change under it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import joblib

CURRENT = "CURRENT"
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ArtifactError(Exception):
    """An artifact directory has no current version, or a version's files are missing or unreadable."""


@dataclass(frozen=True, slots=True)
class ArtifactMeta:
    version: str
    kind: str
    backend: str
    created: str  # ISO-8601 UTC
    data_hash: str  # sha256 of the training rows (see ``data_hash``)
    rows: int
    models: tuple[str, ...]
    metrics: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        d = {
            "version": self.version,
            "kind": self.kind,
            "backend": self.backend,
            "created": self.created,
            "data_hash": self.data_hash,
            "rows": self.rows,
            "models": list(self.models),
            "metrics": self.metrics,
        }
        return json.dumps(d, indent=2, sort_keys=True)

    @staticmethod
    def from_json(raw: str | bytes) -> ArtifactMeta:
        d = json.loads(raw)
        d["models"] = tuple(d.get("models", ()))
        return ArtifactMeta(**d)


def data_hash(lines: Iterable[str]) -> str:
    """Order-independent sha256 of serialized rows: the same rows in any order hash the same."""
    digests = sorted(hashlib.sha256(line.encode()).digest() for line in lines)
    h = hashlib.sha256()
    for d in digests:
        h.update(d)
    return h.hexdigest()


def new_version(now: datetime | None = None) -> str:
    """A sortable, unique version name: UTC timestamp to the microsecond plus a random suffix."""
    now = now or datetime.now(UTC)
    return f"{now:%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex[:6]}"


def publish(
    kind_dir: Path,
    model: object,
    *,
    kind: str,
    backend: str,
    data_hash: str,
    rows: int,
    models: Iterable[str],
    metrics: dict[str, Any] | None = None,
    version: str | None = None,
    make_current: bool = True,
) -> ArtifactMeta:
    """Write a new version of ``model`` and (by default) point ``CURRENT`` at it. Returns its metadata."""
    version = version or new_version()
    if not _VERSION.match(version):
        raise ArtifactError(f"invalid artifact version name {version!r}")
    kind_dir.mkdir(parents=True, exist_ok=True)
    if (kind_dir / f"{version}.json").exists():
        raise ArtifactError(f"artifact version {version} already exists in {kind_dir}")
    meta = ArtifactMeta(
        version=version,
        kind=kind,
        backend=backend,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        data_hash=data_hash,
        rows=rows,
        models=tuple(models),
        metrics=dict(metrics or {}),
    )
    tmp = kind_dir / f".{version}.joblib.{uuid.uuid4().hex[:8]}.tmp"
    joblib.dump(model, tmp)
    tmp.replace(kind_dir / f"{version}.joblib")
    _write_atomic(kind_dir / f"{version}.json", meta.to_json() + "\n")
    if make_current:
        set_current(kind_dir, version)
    return meta


def set_current(kind_dir: Path, version: str) -> None:
    """Point ``CURRENT`` at an existing version (also how an operator rolls back)."""
    if not (kind_dir / f"{version}.joblib").is_file() or not (kind_dir / f"{version}.json").is_file():
        raise ArtifactError(f"artifact version {version} not found in {kind_dir}")
    _write_atomic(kind_dir / CURRENT, version + "\n")


def current_version(kind_dir: Path) -> str | None:
    try:
        text = (kind_dir / CURRENT).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return text or None


def versions(kind_dir: Path) -> list[str]:
    """Every complete version in the directory, oldest first."""
    if not kind_dir.is_dir():
        return []
    names = {p.stem for p in kind_dir.glob("*.json")}
    return sorted(n for n in names if (kind_dir / f"{n}.joblib").is_file())


def load_meta(kind_dir: Path, version: str) -> ArtifactMeta:
    try:
        return ArtifactMeta.from_json((kind_dir / f"{version}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError) as e:
        raise ArtifactError(f"cannot read metadata of {version} in {kind_dir}: {e}") from e


def load_version(kind_dir: Path, version: str) -> Any:
    """Unpickle one version's model. Artifacts are trusted files written by ``publish``."""
    path = kind_dir / f"{version}.joblib"
    try:
        return joblib.load(path)
    except Exception as e:  # unpickling garbage can raise nearly anything (KeyError, UnpicklingError, ...)
        raise ArtifactError(f"cannot load {path}: {e}") from e


def load(kind_dir: Path) -> tuple[str, Any]:
    """The current version's name and model; ``ArtifactError`` when nothing is published yet."""
    version = current_version(kind_dir)
    if version is None:
        raise ArtifactError(f"no artifact published in {kind_dir}")
    return version, load_version(kind_dir, version)


class CurrentWatcher:
    """Cheap change detection on ``CURRENT``: one ``stat`` per poll, a read only when the stat changed.

    Publishing renames a new file over ``CURRENT``, which changes its inode and mtime, so an unchanged stat
    signature means an unchanged pointer. The caller compares the returned version with what it serves.
    """

    def __init__(self, kind_dir: Path) -> None:
        self._path = kind_dir / CURRENT
        self._kind_dir = kind_dir
        self._sig: tuple[int, int, int] | None = None

    def poll(self) -> str | None:
        """The current version if ``CURRENT`` changed since the last poll (or was never seen), else None."""
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            return None
        sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        if sig == self._sig:
            return None
        self._sig = sig
        return current_version(self._kind_dir)

    def reset(self) -> None:
        """Forget the last signature, so the next poll reports the current version again (a retry)."""
        self._sig = None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
