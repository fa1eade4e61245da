"""Versioned artifacts: round trip, versioning, the atomic CURRENT pointer and change detection."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common import artifacts
from services.common.artifacts import ArtifactError, CurrentWatcher

pytestmark = pytest.mark.unit


def _publish(kind_dir: Path, tag: str, **kw: object) -> artifacts.ArtifactMeta:
    return artifacts.publish(
        kind_dir,
        {"tag": tag},
        kind="router",
        backend="fake",
        data_hash=artifacts.data_hash([tag]),
        rows=3,
        models=("a", "b"),
        metrics={"macro_map": 0.5},
        **kw,  # type: ignore[arg-type]
    )


def test_round_trip_and_metadata(tmp_path: Path) -> None:
    meta = _publish(tmp_path, "one")
    version, model = artifacts.load(tmp_path)
    assert version == meta.version
    assert model == {"tag": "one"}
    read = artifacts.load_meta(tmp_path, version)
    assert read == meta
    assert read.models == ("a", "b") and read.metrics == {"macro_map": 0.5} and read.rows == 3
    assert (tmp_path / f"{version}.joblib").is_file() and (tmp_path / f"{version}.json").is_file()
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*"))


def test_versions_are_ordered_and_current_moves(tmp_path: Path) -> None:
    first = _publish(tmp_path, "one")
    second = _publish(tmp_path, "two")
    assert artifacts.versions(tmp_path) == [first.version, second.version]
    assert artifacts.load(tmp_path) == (second.version, {"tag": "two"})
    artifacts.set_current(tmp_path, first.version)  # rollback
    assert artifacts.load(tmp_path) == (first.version, {"tag": "one"})
    third = _publish(tmp_path, "three", make_current=False)
    assert artifacts.current_version(tmp_path) == first.version
    assert third.version in artifacts.versions(tmp_path)


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="no artifact"):
        artifacts.load(tmp_path)
    with pytest.raises(ArtifactError, match="not found"):
        artifacts.set_current(tmp_path, "nope")
    meta = _publish(tmp_path, "one")
    with pytest.raises(ArtifactError, match="already exists"):
        _publish(tmp_path, "again", version=meta.version)
    with pytest.raises(ArtifactError, match="invalid"):
        _publish(tmp_path, "bad", version="../escape")
    (tmp_path / f"{meta.version}.joblib").write_bytes(b"not a pickle")
    with pytest.raises(ArtifactError):
        artifacts.load_version(tmp_path, meta.version)


def test_watcher_reports_each_change_once(tmp_path: Path) -> None:
    watcher = CurrentWatcher(tmp_path)
    assert watcher.poll() is None  # nothing published
    first = _publish(tmp_path, "one")
    assert watcher.poll() == first.version
    assert watcher.poll() is None  # unchanged
    second = _publish(tmp_path, "two")
    assert watcher.poll() == second.version
    watcher.reset()
    assert watcher.poll() == second.version


def test_data_hash_ignores_order_but_not_content() -> None:
    assert artifacts.data_hash(["a", "b"]) == artifacts.data_hash(["b", "a"])
    assert artifacts.data_hash(["a", "b"]) != artifacts.data_hash(["a", "c"])
    assert artifacts.data_hash(["a"]) != artifacts.data_hash(["a", "a"])
