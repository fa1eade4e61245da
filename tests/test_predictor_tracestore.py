"""Trace store: JSONL round trip, and reading trace/outcome rows back from the Redis streams."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio import Redis

from services.common.keys import Keys
from services.common.tracestore import (
    read_outcomes_jsonl,
    read_outcomes_redis,
    read_traces_jsonl,
    read_traces_redis,
    write_jsonl,
)
from services.common.types import OutcomeRow, TraceRow


def _row(pid: str, stage: int, engine: str) -> TraceRow:
    return TraceRow(
        request_id=f"{pid}-{stage}",
        program_id=pid,
        workflow="code",
        stage=stage,
        engine=engine,
        model=f"m-{engine}",
        system_text="sys",
        user_text="task \u00e9\n",
        prompt_text="task",
        prompt_tokens=3,
        completion_tokens=10 + stage,
        predicted=5,
        predicted_p90=9,
        queue_wait_s=0.1,
        run_s=0.2,
        finish_reason="stop",
        extra={"k": [1, 2]},
    )


@pytest.mark.unit
def test_jsonl_round_trip(tmp_path: Path) -> None:
    traces = [_row("p1", 0, "e0"), _row("p1", 1, "e0")]
    outcomes = [OutcomeRow("p1", "code", "m-e0", "e0", 1.0)]
    assert write_jsonl(tmp_path / "t.jsonl", traces) == 2
    write_jsonl(tmp_path / "o.jsonl", outcomes)
    assert read_traces_jsonl(tmp_path / "t.jsonl") == traces
    assert read_outcomes_jsonl(tmp_path / "o.jsonl") == outcomes
    assert not list(tmp_path.glob(".*"))


@pytest.mark.redis
async def test_reads_every_engine_stream_and_outcomes(redis_client: Redis, keys: Keys) -> None:
    expected: list[TraceRow] = []
    for engine, n in (("e0", 3), ("e1", 1205)):  # e1 spans more than one XRANGE page
        await redis_client.sadd(keys.engines(), engine)  # type: ignore[misc]
        pipe = redis_client.pipeline()
        for i in range(n):
            row = _row(f"p{i}", i % 3, engine)
            expected.append(row)
            pipe.xadd(keys.traces(engine), {"row": row.to_json()})
        await pipe.execute()
    await redis_client.sadd(keys.engines(), "idle")  # type: ignore[misc]  # registered, no traces yet
    got = await read_traces_redis(redis_client, keys)
    assert got == expected

    a = OutcomeRow("p1", "code", "m-e0", "e0", 1.0)
    b = OutcomeRow("p2", "math", "m-e1", "e1", 0.25)
    await redis_client.xadd(keys.outcomes(), {"row": a.to_json()})
    # An entry with the row's fields flat instead of one JSON field.
    flat = {"program_id": "p2", "workflow": "math", "model": "m-e1", "engine": "e1", "outcome": "0.25"}
    await redis_client.xadd(keys.outcomes(), flat)  # type: ignore[arg-type]
    assert await read_outcomes_redis(redis_client, keys) == [a, b]
