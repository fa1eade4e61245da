"""Services run on uvloop unless told otherwise (``CHIMERA_EVENT_LOOP``). That cancelled Redis commands end
their tasks there too is in ``test_redis_conn.py``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError

from services.common import loop as event_loop
from services.common.config import CommonSettings


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


@pytest.mark.unit
def test_run_uses_the_loop_asked_for() -> None:
    assert event_loop.run(_loop_module(), "uvloop").startswith("uvloop")
    assert event_loop.run(_loop_module(), "asyncio").startswith("asyncio")


@pytest.mark.unit
def test_uvloop_is_the_default_and_a_misspelt_loop_stops_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHIMERA_EVENT_LOOP", raising=False)
    assert CommonSettings().event_loop == "uvloop"
    monkeypatch.setenv("CHIMERA_EVENT_LOOP", "asyncio")
    assert CommonSettings().event_loop == "asyncio"
    monkeypatch.setenv("CHIMERA_EVENT_LOOP", "trio")
    with pytest.raises(ValidationError, match="CHIMERA_EVENT_LOOP"):
        CommonSettings()


@pytest.mark.unit
def test_the_loop_benchmark_reports_each_pairs_ratio() -> None:
    from bench.load.event_loop_ab import markdown, summarise

    def run(*ms: float) -> dict[str, Any]:
        return {
            "rows": [
                {"point": p, "cpu_ms_per_stage_total": v} for p, v in zip(("c1", "r50"), ms, strict=True)
            ]
        }

    pairs = [
        {"asyncio": run(4.0, 5.0), "uvloop": run(3.0, 5.0)},
        {"asyncio": run(8.0, 4.0), "uvloop": run(4.0, 5.0)},
    ]
    points = summarise(pairs)
    assert points["c1"]["ratios"] == [0.75, 0.5] and points["c1"]["median"] == 0.625
    assert points["r50"] == {
        "asyncio_ms": [5.0, 4.0],
        "uvloop_ms": [5.0, 5.0],
        "ratios": [1.0, 1.25],
        "median": 1.125,
        "min": 1.0,
        "max": 1.25,
    }
    assert "| c1 | 4.00 / 8.00 | 3.00 / 4.00 | 0.62 | 0.50-0.75 |" in markdown(
        {"command": "x", "duration_s": 10.0, "points": points}
    )
