"""Services run on uvloop unless told otherwise (``CHIMERA_EVENT_LOOP``), and what the code relies on from
its loop holds there too: every cancellation of a Redis command in flight ends its task."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from bench.redis_cancel import lost_cancellations
from services.common import loop as event_loop
from services.common.config import CommonSettings
from services.common.keys import Keys
from services.common.redis_client import connect
from services.common.redis_proc import PrivateRedis


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


@pytest.mark.redis
def test_every_cancelled_redis_command_ends_its_task_on_uvloop(
    private_redis: PrivateRedis, keys: Keys
) -> None:
    key = keys.program("uvloop-cancel-probe")

    async def probe() -> tuple[str, int, int]:
        client = connect(private_redis.url, 8)

        async def pipeline() -> None:
            async with client.pipeline(transaction=False) as p:
                p.hset(key, "n", 1)
                p.hget(key, "n")
                await p.execute()

        try:
            lost_get = await lost_cancellations(lambda: client.get(key), 60, 7)
            lost_pipe = await lost_cancellations(pipeline, 60, 11)
            assert await client.ping()
            return await _loop_module(), lost_get, lost_pipe
        finally:
            await client.delete(key)
            await client.aclose()

    module, lost_get, lost_pipe = event_loop.run(probe(), "uvloop")
    assert module.startswith("uvloop")
    assert (lost_get, lost_pipe) == (0, 0)


@pytest.mark.unit
def test_the_loop_benchmark_reports_each_pairs_ratio() -> None:
    from bench.event_loop_ab import markdown, summarise

    def run(*ms: float) -> dict[str, object]:
        return {
            "rows": [
                {"point": p, "cpu_ms_per_stage_total": v} for p, v in zip(("c1", "r50"), ms, strict=True)
            ]
        }

    pairs = [
        {"asyncio": run(4.0, 5.0), "uvloop": run(3.0, 5.0)},
        {"asyncio": run(8.0, 4.0), "uvloop": run(4.0, 5.0)},
    ]
    points = summarise(pairs)  # type: ignore[arg-type]
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
