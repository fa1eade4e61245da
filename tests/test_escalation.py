"""Escalation after a failed tool result: the pure rule (services.policy.escalation), how a failure is read
from a tool's text (services.dispatcher.tool_results), and the real dispatcher on real Redis moving a
program to the stronger engine, recording why, and keeping it there. The router and predictor are
in-process fakes; the engines are written as a worker's registration leaves them."""

from __future__ import annotations

import json
import time

import pytest
from redis.asyncio import Redis
from test_admission_dispatch import FakePredictor, FakeRouter

from services.common.chat import ToolCall
from services.common.keys import EngineField, Keys, RequestField
from services.common.queue import QueueStore
from services.common.types import (
    ChatMessage,
    EngineProfile,
    EngineSnapshot,
    SamplingParams,
    StageRequest,
)
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.dispatch import Dispatcher
from services.dispatcher.tool_results import after_failed_tool, failed, history_tokens
from services.inspect.explain import explain
from services.policy.escalation import escalate
from services.policy.knobs import Knobs

SMALL = EngineProfile(decode_ms_per_token=10.0, max_batch_size=8, prefill_ms_per_token=0.5)
BIG = EngineProfile(decode_ms_per_token=25.0, max_batch_size=8, prefill_ms_per_token=1.5)
CONF = {"small": 0.6, "big": 0.9}


def _pool(big_queued: int = 0, big_alive: bool = True) -> list[EngineSnapshot]:
    return [
        EngineSnapshot("s0", "small", SMALL, inflight_tokens=0),
        EngineSnapshot(
            "b0", "big", BIG, inflight_tokens=300 * big_queued, queued=big_queued, alive=big_alive
        ),
    ]


@pytest.mark.unit
def test_a_stronger_model_within_the_slack_takes_the_next_stage() -> None:
    # Idle: staying costs 600 x (10 + 2 x 0.5) = 6,600 ms; moving 600 x (25 + 2 x 1.5) + 500 x 1.5 = 17,550.
    pool = _pool()
    esc = escalate(pool[0], pool, CONF, 500, Knobs(tau=2.0))
    assert esc.to is not None and esc.to.engine_id == "b0"
    assert esc.stay_ms == pytest.approx(6600.0) and esc.to.move_ms == pytest.approx(17550.0)
    assert esc.to.prefix_ms == pytest.approx(750.0)
    record = esc.to_record()
    assert record["to"] == "b0" and record["checks"][0]["within_slack"] is True


@pytest.mark.unit
def test_the_move_is_refused_by_its_slack_its_lost_prefix_or_its_load() -> None:
    pool = _pool()
    assert escalate(pool[0], pool, CONF, 500, Knobs(tau=0.5)).to is None  # 17,550 > 1.5 x 6,600
    # The escalation's own slack, when set, stands in for the first stage's tau.
    own = escalate(pool[0], pool, CONF, 500, Knobs(tau=0.5, escalation_tau=2.0))
    assert own.to is not None and own.slack == 2.0
    # The same move with a long history: 5,000 tokens to prefill again cost 7,500 ms more (24,300 > 19,800).
    assert escalate(pool[0], pool, CONF, 5000, Knobs(tau=2.0)).to is None
    loaded = _pool(big_queued=8)
    esc = escalate(loaded[0], loaded, CONF, 500, Knobs(tau=2.0))
    assert esc.to is None and esc.checks[0].stronger and not esc.checks[0].within_slack


@pytest.mark.unit
def test_escalation_only_goes_up_and_never_to_a_dead_or_unrated_engine() -> None:
    pool = _pool()
    big = pool[1]
    # From the big model the small one is faster and within any slack, but weaker: never back down.
    assert escalate(big, pool, CONF, 500, Knobs(tau=100.0)).to is None
    # Not stronger by delta_s.
    assert escalate(pool[0], pool, {"small": 0.88, "big": 0.9}, 10, Knobs(tau=100.0)).to is None
    dead = _pool(big_alive=False)
    assert escalate(dead[0], dead, CONF, 10, Knobs(tau=100.0)).checks == ()
    assert escalate(pool[0], pool, {"small": 0.6}, 10, Knobs(tau=100.0)).checks == ()


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "is_failure"),
    [
        ("FAILED:\nTraceback (most recent call last):\n  ...\nAssertionError", True),
        ('Traceback (most recent call last):\n  File "x.py", line 1', True),
        ("NameError: name 'foo' is not defined", True),
        ("  ValueError: bad\n", False),  # indented: a quoted log line, not the tool's own verdict
        ('{"error": "not found"}', True),
        ("build finished with exit code 2", True),
        ("PASSED", False),
        ("exit code 0", False),
        ("The docs describe error handling: raise ValueError for bad input.", False),
        ("no errors found", False),
    ],
)
def test_what_reads_as_a_failed_tool_result(text: str, is_failure: bool) -> None:
    assert failed(text) is is_failure


@pytest.mark.unit
def test_only_the_tool_results_this_stage_answers_count() -> None:
    call = ToolCall("c1", "run_tests", '{"code": "def f():\\n    return 1"}')
    history = [
        ChatMessage("user", "write f"),
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", "FAILED:\nAssertionError", tool_call_id="c1"),
    ]
    assert after_failed_tool(history)
    assert not after_failed_tool([*history, ChatMessage("assistant", "fixed"), ChatMessage("user", "thanks")])
    assert not after_failed_tool([*history[:2], ChatMessage("tool", "PASSED", tool_call_id="c1")])
    # The call's arguments are part of the history an engine without its KV prefix must prefill.
    assert history_tokens(history) > history_tokens([history[0], history[2]]) + 5


# --- the real dispatcher on real Redis -------------------------------------------------------------------

# The router and predictor fakes of the admission tests: m-small 0.6, m-big 0.9; every prediction (100, 200).
ENGINES = {"e0": ("m-small", "10"), "e1": ("m-big", "25")}


async def _engines(r: Redis, keys: Keys) -> None:
    for eid, (model, ms) in ENGINES.items():
        await r.sadd(keys.engines(), eid)
        await r.hset(
            keys.engine_info(eid),
            mapping={
                EngineField.MODEL: model,
                EngineField.DECODE_MS_PER_TOKEN: ms,
                EngineField.MAX_BATCH_SIZE: "8",
                EngineField.HEARTBEAT_MS: str(int(time.time() * 1000)),
                # The big engine holds a little work, so the paper's rule puts a first stage on the small one
                # (L_fast = 0 on an idle pool would let the confident engine win).
                EngineField.LOAD: "100" if eid == "e1" else "0",
            },
        )


def _stage(program: str, stage: int, tool_result: str | None) -> StageRequest:
    messages = [ChatMessage("user", "write f")]
    if tool_result is not None:
        call = ToolCall(f"c{stage}", "run_tests", '{"code": "def f(): pass"}')
        messages += [
            ChatMessage("assistant", "", tool_calls=(call,)),
            ChatMessage("tool", tool_result, tool_call_id=call.id),
        ]
    return StageRequest(
        f"{program}-{stage}", program, stage, "code/agent", tuple(messages), SamplingParams(max_tokens=64)
    )


async def _decision(r: Redis, keys: Keys, engine: str, request_id: str) -> dict[str, object]:
    raw = await r.hget(keys.request(engine, request_id), RequestField.DECISION)
    out: dict[str, object] = json.loads(raw)
    return out


@pytest.mark.redis
@pytest.mark.timeout(60)
async def test_the_dispatcher_escalates_after_a_failure_records_why_and_stays_there(
    redis_client: Redis, keys: Keys
) -> None:
    await _engines(redis_client, keys)
    settings = DispatcherSettings(key_prefix=keys.prefix, tau=2.0, escalate=True)
    d = Dispatcher(QueueStore(redis_client, keys), redis_client, FakeRouter(), FakePredictor(), settings)
    first = await d.dispatch(_stage("agent", 0, None))
    assert first.engine == "e0"
    passed = await d.dispatch(_stage("agent", 1, "PASSED"))
    assert (passed.engine, passed.branch) == ("e0", "reuse")  # no failure, nothing weighed
    assert "escalation" not in await _decision(redis_client, keys, passed.engine, passed.request.request_id)
    moved = await d.dispatch(_stage("agent", 2, "FAILED:\nAssertionError"))
    assert (moved.engine, moved.branch) == ("e1", "escalated")
    record = await _decision(redis_client, keys, moved.engine, moved.request.request_id)
    assert record["branch"] == "escalated"
    escalation = record["escalation"]
    assert isinstance(escalation, dict) and escalation["from"] == "e0" and escalation["to"] == "e1"
    assert await redis_client.hget(keys.program("agent"), "engine") == "e1"
    why = " ".join((await explain(redis_client, keys, moved.request.request_id)).reasons)
    assert "escalated to e1 (m-big)" in why and "failed on e0" in why
    # Another failure on the big model: nothing stronger, the program stays where it moved.
    again = await d.dispatch(_stage("agent", 3, "FAILED:\nAssertionError"))
    assert (again.engine, again.branch) == ("e1", "reuse")


@pytest.mark.redis
@pytest.mark.timeout(60)
@pytest.mark.parametrize("change", [{"escalate": False}, {"tau": 0.5}], ids=["off", "beyond-the-slack"])
async def test_without_escalation_or_its_slack_a_failed_stage_stays_put(
    redis_client: Redis, keys: Keys, change: dict[str, object]
) -> None:
    await _engines(redis_client, keys)
    settings = DispatcherSettings(**{"key_prefix": keys.prefix, "tau": 2.0, "escalate": True, **change})  # type: ignore[arg-type]
    d = Dispatcher(QueueStore(redis_client, keys), redis_client, FakeRouter(), FakePredictor(), settings)
    await d.dispatch(_stage("agent", 0, None))
    stay = await d.dispatch(_stage("agent", 1, "FAILED:\nAssertionError"))
    assert (stay.engine, stay.branch) == ("e0", "reuse")
    record = await _decision(redis_client, keys, stay.engine, stay.request.request_id)
    assert ("escalation" in record) is bool(settings.escalate)
