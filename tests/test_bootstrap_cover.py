"""The launcher's bootstrap replaces a current version that lacks a pool model, and says so."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from services.common import artifacts
from services.launcher import bootstrap
from services.launcher.pool import PoolSpec


class _Meta:
    def __init__(self, models: list[str]) -> None:
        self.models = models


def test_a_version_missing_a_pool_model_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pool = PoolSpec.model_validate(
        {
            "engines": [
                {"id": "a", "model": "m-small", "kind": "simulated"},
                {"id": "b", "model": "m-big", "kind": "simulated"},
            ]
        }
    )
    monkeypatch.setattr(artifacts, "current_version", lambda _d: "v1")
    monkeypatch.setattr(artifacts, "load_meta", lambda _d, _v: _Meta(["m-small"]))
    with caplog.at_level(logging.WARNING, logger=bootstrap.log.name):
        assert not bootstrap._covers(tmp_path, pool)
    assert "v1 knows no ['m-big']" in caplog.text
    monkeypatch.setattr(artifacts, "load_meta", lambda _d, _v: _Meta(["m-small", "m-big"]))
    caplog.clear()
    assert bootstrap._covers(tmp_path, pool) and not caplog.text
