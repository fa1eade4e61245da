"""The fault benchmark's counting (bench/faults/count.py) on synthetic streams and its report (unit, no
stack), and one smoke of the harness on real processes (e2e)."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from bench.faults.count import (
    HUNG,
    NO_FINAL,
    StageRecord,
    WorkflowRecord,
    contract_text,
    count,
    naive_text,
    outcome,
)
from bench.faults.drive import DriveConfig, _stage, plan
from bench.faults.report import write
from bench.faults.stack import request_state
from services.common.keys import Keys
from services.common.redis_client import connect_sync
from services.common.redis_proc import PrivateRedis
from services.launcher.stack import Stack
from services.sdk.client import AsyncClient
from services.workload.corpus import embedded_corpus


def _ok(stage: int, text: str = "abc def", deltas: tuple[tuple[int, str], ...] | None = None) -> StageRecord:
    parts = deltas if deltas is not None else ((1, text[:3]), (1, text[3:]))
    return StageRecord(stage, (f"p-s{stage}-t0",), parts, text, "length", 1, "small")


def _wf(*stages: StageRecord, n: int | None = None, pid: str = "p") -> WorkflowRecord:
    return WorkflowRecord(pid, "code/planner-coder", n if n is not None else len(stages), stages)


@pytest.mark.unit
def test_contract_text_starts_over_on_a_higher_attempt_and_drops_stale_ones() -> None:
    deltas = ((1, "he"), (1, "ll"), (2, "hel"), (1, "zz"), (2, "lo"))
    assert contract_text(deltas) == "hello"
    assert naive_text(deltas) == "hellhelzzlo"


@pytest.mark.unit
def test_a_clean_run_is_completed_with_nothing_else_counted() -> None:
    c = count([_wf(_ok(0), _ok(1))], traced={"p-s0-t0": 1, "p-s1-t0": 1})
    assert (c.started, c.completed, c.lost, c.failed_retryable, c.failed_other) == (1, 1, 0, 0, 0)
    assert (c.duplicated_stages, c.duplicated_workflows, c.traced_twice, c.restarted_stages) == (0, 0, 0, 0)
    assert c.stages_answered == 2


@pytest.mark.unit
def test_text_of_two_attempts_under_one_attempt_number_is_duplicated() -> None:
    # The restarted attempt's text arrives marked as attempt 1 again: a client cannot tell it apart.
    doubled = _ok(0, "abcdef", ((1, "abc"), (1, "abc"), (1, "def")))
    c = count([_wf(doubled)])
    assert c.completed == 1 and c.duplicated_stages == 1 and c.duplicated_workflows == 1
    assert c.examples[0]["streamed_chars"] == 9 and c.examples[0]["final_chars"] == 6


@pytest.mark.unit
def test_a_restart_marked_by_its_attempt_number_is_restarted_not_duplicated() -> None:
    marked = _ok(0, "abcdef", ((1, "abc"), (2, "abc"), (2, "def")))
    c = count([_wf(marked)])
    assert c.duplicated_stages == 0 and c.restarted_stages == 1 and c.completed == 1


@pytest.mark.unit
def test_missing_streamed_text_is_a_mismatch_too() -> None:
    assert count([_wf(_ok(0, "abcdef", ((1, "abc"),)))]).duplicated_stages == 1


@pytest.mark.unit
def test_a_stage_answered_twice_in_the_traces_is_duplicated() -> None:
    c = count([_wf(_ok(0), _ok(1))], traced={"p-s0-t0": 1, "p-s1-t0": 2})
    assert c.traced_twice == 1 and c.duplicated_workflows == 1 and c.duplicated_stages == 0


@pytest.mark.unit
def test_traces_unknown_after_redis_lost_its_data_count_nothing() -> None:
    assert count([_wf(_ok(0))], traced=None).traced_twice == 0


@pytest.mark.unit
@pytest.mark.parametrize(
    ("stage", "reason"),
    [
        (StageRecord(0, ("r",), ((1, "ab"),), None, error_code=HUNG), "hung"),
        (StageRecord(0, ("r",), (), None, error_code=NO_FINAL), "no_final"),
        (StageRecord(0, ("r",), ((1, "ab"),), "ab", "cancelled", 1), "cancelled"),
        (StageRecord(0, ("r",), (), "", "stop", 1), "empty_answer"),
    ],
)
def test_answers_that_never_came_are_lost(stage: StageRecord, reason: str) -> None:
    assert outcome(_wf(_ok(0), replace(stage, stage=1))) == ("lost", reason)


@pytest.mark.unit
def test_a_workflow_that_stopped_short_without_an_error_is_lost() -> None:
    assert outcome(_wf(_ok(0), n=3)) == ("lost", "missing_stage")


@pytest.mark.unit
def test_errors_are_split_by_whether_the_code_says_retry() -> None:
    unavailable = StageRecord(1, ("r",), (), None, error_code="UNAVAILABLE", error="engine gone")
    internal = StageRecord(1, ("r",), (), None, error_code="INTERNAL", error="boom")
    c = count([_wf(_ok(0), unavailable, n=2, pid="a"), _wf(_ok(0), internal, n=2, pid="b"), _wf(_ok(0))])
    assert (c.failed_retryable, c.failed_other, c.completed, c.lost) == (1, 1, 1, 0)
    assert c.codes == {"failed_other:INTERNAL": 1, "failed_retryable:UNAVAILABLE": 1}


def _row(kind: str, lost: int) -> dict[str, object]:
    counts = count([_wf(StageRecord(0, ("r",), (), None, error_code=HUNG))] * lost + [_wf(_ok(0))])
    return {
        "kind": kind,
        "injection": {"kind": kind, "injectable": True, "target": "x", "restarted_by": "supervisor",
                      "back_after_s": 1.0, "note": ""},
        "fault_after_s": 1.0, "stages_answered_before_fault": 1, "stages_planned": 4,
        "counts": counts.as_dict(), "recovery_s": 2.5, "residue": {"small.claims": 1},
        "drained_after_s": None,
        "redis_data_survived": True, "restarts": {}, "log_errors": {}, "run_s": 3.0,
    }  # fmt: skip


@pytest.mark.unit
def test_results_merge_by_kind_and_the_table_names_the_losses(tmp_path: Path) -> None:
    meta = {"commit": "abc", "date": "today", "command": "x", "workflows": 2, "seed": 1, "time_scale": 2.0,
            "lease_s": 2.0, "max_tokens": 8, "run_s": 5.0}  # fmt: skip
    write(tmp_path, "kinds", {"meta": meta, "kinds": {"worker_kill": _row("worker_kill", 1)}})
    write(tmp_path, "kinds", {"meta": meta, "kinds": {"redis_kill": _row("redis_kill", 0)}})
    data = json.loads((tmp_path / "faults.json").read_text())
    assert set(data["kinds"]) == {"worker_kill", "redis_kill"}
    md = (tmp_path / "faults.md").read_text()
    assert "| worker_kill | yes | supervisor | 2 | 1 | 0 | 0 | 1 (hung 1) |" in md
    assert "small.claims=1" in md


@pytest.mark.unit
def test_a_hung_stage_carries_what_redis_held_for_it_into_the_failures() -> None:
    held = {"small": {"state": "queued"}}
    hung = StageRecord(
        0, ("p-s0",), ((1, "ab"),), error_code=HUNG, redis_state=held, seconds=90.1, ended_unix=5.0
    )
    (failure,) = count([_wf(hung, n=2)]).failures
    assert failure["code"] == HUNG and failure["deltas"] == 1
    assert (failure["seconds"], failure["ended_unix"]) == (90.1, 5.0)
    assert failure["redis_state"] == held


@pytest.mark.redis
def test_request_state_says_where_a_request_stands_on_each_engine(
    private_redis: PrivateRedis, keys: Keys
) -> None:
    rid = "wf-1-s0"
    stack = SimpleNamespace(
        redis_url=private_redis.url,
        pool=SimpleNamespace(engines=(SimpleNamespace(id="small"), SimpleNamespace(id="large"))),
    )
    r = connect_sync(private_redis.url)
    try:
        r.hset(keys.program("wf-1"), mapping={"engine": "small", "request_id": rid, "confidences": "{}"})
        r.hset(
            keys.request("small", rid), mapping={"state": "running", "attempt": 2, "payload": "a long prompt"}
        )
        r.zadd(keys.claims("small"), {rid: 123.0})
        r.xadd(keys.output("small", rid), {"ev": json.dumps({"t": "delta", "a": 2, "text": "hi"})})
        state = request_state(cast(Stack, stack), keys, "wf-1", rid)
    finally:
        for k in r.scan_iter(f"{keys.prefix}:*"):
            r.delete(k)
        r.close()
    assert state["program"] == {"engine": "small", "request_id": rid}  # not the confidences
    assert set(state) == {"program", "small"}  # nothing on "large"
    small = state["small"]
    assert small["state"] == "running" and small["attempt"] == "2" and "payload" not in small
    assert small["claimed"] == 123.0 and small["queued"] is None
    assert small["out_len"] == 1 and '"delta"' in small["out_last"][0]


@pytest.mark.unit
def test_a_hung_stage_is_timed_to_its_timeout_and_then_inspected() -> None:
    class Silent:  # a fake client whose stream never says anything
        async def stream(self, *_a: object, **_kw: object) -> AsyncIterator[object]:
            await asyncio.Event().wait()
            yield None

    seen: list[tuple[str, str]] = []

    async def inspect(program_id: str, rid: str) -> Mapping[str, Any]:
        seen.append((program_id, rid))
        await asyncio.sleep(0.5)  # a slow read must not count as time the stage ran
        return {"small": {"state": "queued"}}

    (p,) = plan(embedded_corpus().problems, 1, random.Random(1))
    client = cast(AsyncClient, Silent())
    rec = asyncio.run(_stage(client, p, 0, [], DriveConfig(), 0.2, inspect))
    assert rec.error_code == HUNG and rec.redis_state == {"small": {"state": "queued"}}
    assert seen == [(p.program_id, f"{p.program_id}-s0")]
    assert 0.2 <= rec.seconds < 0.5
