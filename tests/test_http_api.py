"""The OpenAI-compatible HTTP front door, driven by the official ``openai`` client.

The real dispatcher (HTTP and gRPC on free ports, one Dispatcher) runs in process against the fake router,
predictor and workers of ``dispatcher_fakes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
from dispatcher_fakes import (
    dispatcher_server,
    fake_dependencies,
    fake_workers,
    register_engines,
    simulated_stack,
)
from redis.asyncio import Redis

from services.common.chat import ToolUse
from services.common.keys import Keys
from services.common.queue import QueueStore
from services.common.redis_proc import PrivateRedis
from services.dispatcher import errors
from services.dispatcher.http_api import HttpServer, OpenAIFrontDoor
from services.dispatcher.http_input import resolve_identity, session_program
from services.dispatcher.openai_schema import HTTP_ERRORS, domain_error

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

MESSAGES: list[Any] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "write a haiku"},
]


@dataclass
class Http:
    client: openai.AsyncOpenAI
    base_url: str
    redis: Redis
    keys: Keys


@pytest.fixture
async def http(private_redis: PrivateRedis, keys: Keys, redis_client: Redis) -> AsyncIterator[Http]:
    await register_engines(redis_client, keys)
    async with (
        fake_workers(QueueStore(redis_client, keys)),
        fake_dependencies(private_redis, keys) as settings,
        dispatcher_server(settings, redis_client, keys) as grpc_server,
    ):
        server = HttpServer(OpenAIFrontDoor(grpc_server.dispatcher).app(), "127.0.0.1", 0, 1.0)
        port = await server.start()
        base = f"http://127.0.0.1:{port}/v1"
        client = openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=20)
        try:
            yield Http(client, base, redis_client, keys)
        finally:
            await client.close()
            await server.stop()


async def _request_fields(h: Http, request_id: str) -> tuple[str, dict[str, str]]:
    """(engine, request hash) of a request, wherever it was queued."""
    for engine in ("e0", "e1"):
        fields = await h.redis.hgetall(h.keys.request(engine, request_id))
        if fields:
            return engine, {str(k): str(v) for k, v in fields.items()}
    raise AssertionError(f"request {request_id} not found")


async def _streamed(h: Http, headers: dict[str, str], **kw: Any) -> tuple[str, list[Any]]:
    stream = await h.client.chat.completions.create(
        model="auto", messages=MESSAGES, stream=True, extra_headers=headers, **kw
    )
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


async def test_three_stage_workflow_lands_on_one_model_with_one_program_id(http: Http) -> None:
    ids, models = [], []
    for stage in range(3):
        headers = {
            "X-Chimera-Program-Id": "wf-1",
            "X-Chimera-Stage": str(stage),
            "X-Chimera-Workflow": "code/planner-coder",
            "X-Chimera-Request-Id": f"wf-1-s{stage}",
        }
        if stage == 1:
            text, chunks = await _streamed(http, headers, stream_options={"include_usage": True})
            assert text == "Hello"
            # The usage chunk comes last, with no choices, after the chunk carrying finish_reason.
            assert chunks[-1].choices == [] and chunks[-1].usage is not None
            assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (7, 2)
            assert chunks[-2].choices[0].finish_reason == "stop"
            assert chunks[0].choices[0].delta.role == "assistant"
            assert all(c.id == "chatcmpl-wf-1-s1" for c in chunks)
            models.append(chunks[-1].model)
        else:
            raw = await http.client.chat.completions.with_raw_response.create(
                model="auto", messages=MESSAGES, extra_headers=headers, max_tokens=32
            )
            assert raw.headers["x-chimera-program-id"] == "wf-1"
            resp = raw.parse()
            assert resp.choices[0].message.content == "Hello"
            assert resp.usage is not None and resp.usage.total_tokens == 9
            assert resp.model_extra is not None and resp.model_extra["chimera"]["stage"] == stage
            models.append(resp.model)
        ids.append(f"wf-1-s{stage}")
    placed = [await _request_fields(http, rid) for rid in ids]
    assert {engine for engine, _ in placed} == {"e1"} and set(models) == {"m-big"}
    assert {f["program_id"] for _, f in placed} == {"wf-1"}
    assert [json.loads(f["payload"])["stage"] for _, f in placed] == [0, 1, 2]
    assert [json.loads(f["payload"])["workflow"] for _, f in placed] == ["code/planner-coder"] * 3
    assert await http.redis.hget(http.keys.program("wf-1"), "stage") == "2"


async def test_metadata_identity_without_stage_runs_the_next_stage(http: Http) -> None:
    meta = {"program_id": "wf-meta", "workflow": "math/solver-verifier"}
    for i in range(2):
        resp = await http.client.chat.completions.create(
            model="m-small", messages=MESSAGES, metadata={**meta, "request_id": f"m{i}"}
        )
        assert resp.model == "m-small"
    stages = [json.loads((await _request_fields(http, f"m{i}"))[1]["payload"])["stage"] for i in range(2)]
    assert stages == [0, 1]


async def test_request_without_identity_is_a_new_program_that_lapses(http: Http) -> None:
    text, chunks = await _streamed(http, {})
    assert text == "Hello" and chunks[-1].choices[0].finish_reason == "stop"
    raw = await http.client.chat.completions.with_raw_response.create(model="auto", messages=MESSAGES)
    assert raw.headers["x-chimera-identity"] == "new"
    resp = raw.parse()
    assert resp.model_extra is not None
    program = resp.model_extra["chimera"]["program_id"]
    assert program.startswith("http-") and resp.model_extra["chimera"]["stage"] == 0
    # No client will end these programs: each row waits for a continuation, then lapses on its own.
    rows = [k async for k in http.redis.scan_iter(match=http.keys.program_pattern())]
    assert len(rows) == 2
    for row in rows:
        assert 0 < await http.redis.ttl(row) <= 600


async def test_a_header_less_conversation_continues_its_program_on_its_engine(http: Http) -> None:
    first = await http.client.chat.completions.with_raw_response.create(model="auto", messages=MESSAGES)
    answer = first.parse().choices[0].message.content
    program, engine = first.headers["x-chimera-program-id"], first.headers["x-chimera-engine"]
    turns: list[Any] = [*MESSAGES, {"role": "assistant", "content": f"  {answer}\n"}]
    for stage in (1, 2):
        turns.append({"role": "user", "content": f"and again ({stage})"})
        raw = await http.client.chat.completions.with_raw_response.create(model="auto", messages=turns)
        assert raw.headers["x-chimera-identity"] == "continuation"
        assert raw.headers["x-chimera-program-id"] == program
        assert raw.headers["x-chimera-stage"] == str(stage)
        assert raw.headers["x-chimera-engine"] == engine
        turns.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
    # A fork (turn 1's history sent again, as a retried turn is) is the program's next stage too.
    raw = await http.client.chat.completions.with_raw_response.create(model="auto", messages=turns[:4])
    assert (raw.headers["x-chimera-program-id"], raw.headers["x-chimera-stage"]) == (program, "3")
    # An assistant message Chimera never answered continues nothing: a new program.
    forged = [
        *MESSAGES,
        {"role": "assistant", "content": "not what was said"},
        {"role": "user", "content": "?"},
    ]
    raw = await http.client.chat.completions.with_raw_response.create(model="auto", messages=forged)
    assert raw.headers["x-chimera-identity"] == "new" and raw.headers["x-chimera-program-id"] != program


async def test_a_session_header_names_one_program_across_calls(http: Http) -> None:
    session = {"x-session-affinity": "ses_7f3a"}
    stages, programs = [], set()
    for _ in range(2):
        raw = await http.client.chat.completions.with_raw_response.create(
            model="auto", messages=MESSAGES, extra_headers=session
        )
        assert raw.headers["x-chimera-identity"] == "session"
        programs.add(raw.headers["x-chimera-program-id"])
        stages.append(raw.headers["x-chimera-stage"])
    assert programs == {session_program("ses_7f3a")} and stages == ["0", "1"]


async def test_a_one_stage_workflows_prediction_is_capped_at_its_max_tokens(http: Http) -> None:
    # The fake predictor says 40 (p50) and 80 (p90). Nothing follows a one-stage workflow, so its remaining
    # output is at most max_tokens; a stage of a longer workflow keeps the predictor's figure.
    await http.client.chat.completions.create(
        model="auto", messages=MESSAGES, max_tokens=16, extra_headers={"X-Chimera-Request-Id": "solo"}
    )
    staged = {"X-Chimera-Program-Id": "wf-cap", "X-Chimera-Stage": "0", "X-Chimera-Request-Id": "cap-s0"}
    await http.client.chat.completions.create(
        model="auto", messages=MESSAGES, max_tokens=16, extra_headers=staged
    )
    solo, first = [await _request_fields(http, rid) for rid in ("solo", "cap-s0")]
    assert (solo[1]["y"], solo[1]["y90"]) == ("16", "16")
    assert (first[1]["y"], first[1]["y90"]) == ("40", "80")


async def test_legacy_completions_streamed_and_not(http: Http) -> None:
    resp = await http.client.completions.create(model="auto", prompt="say hello", max_tokens=8)
    assert (resp.choices[0].text, resp.object, resp.model) == ("Hello", "text_completion", "m-big")
    stream = await http.client.completions.create(
        model="auto", prompt="say hello", stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Hello"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2


async def test_models_lists_auto_and_every_registered_model(http: Http) -> None:
    page = await http.client.models.list()
    assert [m.id for m in page.data] == ["auto", "m-big", "m-small"]


async def _error(call: Any) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as err:
        await call
    return err.value


async def test_a_stream_whose_request_was_re_run_is_finished_not_failed(http: Http) -> None:
    # The re-run reproduces the text (a seed from the request id; the fake answers the same), so the door
    # sends the rest after what it already streamed instead of ending with stream_restarted.
    stream = await http.client.chat.completions.create(
        model="auto",
        messages=[{"role": "user", "content": "rerun this"}],
        stream=True,
        extra_headers={"X-Chimera-Request-Id": "rerun-1"},
    )
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello"
    assert chunks[-1].choices[0].finish_reason == "stop"
    _engine, fields = await _request_fields(http, "rerun-1")
    assert fields["attempt"] == "2"


async def test_errors_have_openai_shape_and_status(http: Http) -> None:
    c = http.client
    wizard: list[Any] = [{"role": "wizard", "content": "x"}]
    bad_role = await _error(c.chat.completions.create(model="auto", messages=wizard))
    assert (bad_role.status_code, bad_role.type, bad_role.code) == (
        400,
        "invalid_request_error",
        "invalid_argument",
    )
    assert "role" in bad_role.message
    unknown = await _error(c.chat.completions.create(model="m-huge", messages=MESSAGES))
    assert (unknown.status_code, unknown.code, unknown.param) == (404, "not_found", "model")
    two = await _error(c.chat.completions.create(model="auto", messages=MESSAGES, n=2))
    assert (two.status_code, two.param) == (400, "n")
    # A field Chimera cannot honour yet is refused by name, never dropped (services.dispatcher.openai_fields).
    bias = await _error(c.chat.completions.create(model="auto", messages=MESSAGES, logit_bias={"1": 5}))
    assert (bias.status_code, bias.param) == (400, "logit_bias") and "not supported" in bias.message
    add = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    mul = {"type": "function", "function": {"name": "mul"}}
    named = await _error(
        c.chat.completions.create(model="auto", messages=MESSAGES, tools=[add], tool_choice=mul)  # type: ignore[list-item, arg-type]
    )
    assert named.status_code == 400 and "not in tools" in named.message
    huge = await _error(c.completions.create(model="auto", prompt="x" * 2001))
    assert (huge.status_code, huge.type) == (413, "invalid_request_error")
    many = await _error(c.completions.create(model="auto", prompt="x", max_tokens=10_000))
    assert many.status_code == 400 and "max_tokens" in many.message
    headers = {"X-Chimera-Program-Id": "wf-err", "X-Chimera-Stage": "2", "X-Chimera-Request-Id": "dup"}
    first = await c.chat.completions.create(model="auto", messages=MESSAGES, extra_headers=headers)
    # The same request again is a retry: it gets the same answer, not a second run.
    again = await c.chat.completions.create(model="auto", messages=MESSAGES, extra_headers=headers)
    assert again.choices[0].message.content == first.choices[0].message.content
    # The same id for another stage is not a retry.
    reused = {**headers, "X-Chimera-Stage": "3"}
    dup = await _error(c.chat.completions.create(model="auto", messages=MESSAGES, extra_headers=reused))
    assert (dup.status_code, dup.type, dup.code) == (409, "conflict_error", "already_exists")
    back = {**headers, "X-Chimera-Stage": "1", "X-Chimera-Request-Id": "back"}
    backwards = await _error(c.chat.completions.create(model="auto", messages=MESSAGES, extra_headers=back))
    assert (backwards.status_code, backwards.code) == (409, "failed_precondition")
    bad_stage = {"X-Chimera-Program-Id": "wf-err", "X-Chimera-Stage": "two"}
    stage = await _error(c.chat.completions.create(model="auto", messages=MESSAGES, extra_headers=bad_stage))
    assert stage.status_code == 400 and "stage" in stage.message
    # Nothing but the one good stage was written.
    assert await http.redis.hget(http.keys.program("wf-err"), "request_id") == "dup"


async def test_deadline_is_504_and_mid_stream_errors_reach_the_client(http: Http) -> None:
    hold: list[Any] = [{"role": "user", "content": "hold this"}]
    slow = await _error(
        http.client.chat.completions.create(
            model="auto",
            messages=hold,
            extra_headers={"X-Chimera-Timeout-Ms": "300"},
        )
    )
    assert (slow.status_code, slow.type, slow.code) == (504, "timeout_error", "deadline_exceeded")
    stream = await http.client.chat.completions.create(
        model="auto",
        messages=hold,
        stream=True,
        extra_headers={"X-Chimera-Timeout-Ms": "300"},
    )
    with pytest.raises(openai.APIError) as err:
        _ = [c async for c in stream]
    assert "deadline" in err.value.message
    # Both held requests were cancelled, so the engine's load drained back to zero.
    deadline = time.monotonic() + 10
    while (
        int(await http.redis.hget(http.keys.engine_info("e1"), "load") or 0) and time.monotonic() < deadline
    ):
        await asyncio.sleep(0.05)
    assert int(await http.redis.hget(http.keys.engine_info("e1"), "load") or 0) == 0


async def test_no_live_engine_is_503_and_malformed_json_is_400(http: Http) -> None:
    await register_engines(http.redis, http.keys, heartbeat_ms=int((time.time() - 3600) * 1000))
    down = await _error(http.client.chat.completions.create(model="auto", messages=MESSAGES))
    assert (down.status_code, down.type) == (503, "service_unavailable_error")
    async with httpx.AsyncClient(base_url=http.base_url) as raw:
        resp = await raw.post(
            "/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert resp.status_code == 400 and set(resp.json()["error"]) == {"message", "type", "param", "code"}
        resp = await raw.get("/no-such-route")
        assert resp.status_code == 404 and "error" in resp.json()


@pytest.mark.unit
def test_identity_headers_win_over_metadata_and_sessions() -> None:
    session = {"x-session-id": "s-1", "x-claude-code-session-id": "s-2"}
    ident = resolve_identity(
        {"x-chimera-program-id": "p-h", **session}, {"program_id": "p-m", "stage": "3", "workflow": "w"}
    )
    assert (ident.program_id, ident.stage, ident.workflow, ident.source) == ("p-h", 3, "w", "header")
    by_meta = resolve_identity(session, {"program_id": "p-m"}, prompt_cache_key="k")
    assert (by_meta.program_id, by_meta.source, by_meta.unnamed) == ("p-m", "metadata", False)
    # A session id: the first header of SESSION_HEADERS, then prompt_cache_key; its stage is its next.
    by_session = resolve_identity({"x-chimera-stage": "5", **session}, None, prompt_cache_key="k")
    assert (by_session.program_id, by_session.source, by_session.stage) == (
        session_program("s-1"),
        "session",
        None,
    )
    assert resolve_identity({"session_id": " "}, None, prompt_cache_key="k").program_id == session_program(
        "k"
    )
    fresh = resolve_identity({}, None, prompt_cache_key="  ")
    assert fresh.new and fresh.unnamed and fresh.stage == 0 and fresh.workflow == "default"
    assert fresh.last_stage(None) and not fresh.last_stage(ToolUse(tools=(), choice="auto"))
    assert resolve_identity({"x-chimera-program-id": "p"}, None).stage is None


async def _wait_state(h: Http, rid: str, state: str, timeout_s: float = 10.0) -> None:
    # Either engine: on a loaded machine the router may miss its deadline and the request goes to the
    # fastest engine instead of the most confident one; where it runs is not what these tests check.
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        with contextlib.suppress(AssertionError):  # not queued yet
            engine, fields = await _request_fields(h, rid)
            seen = (engine, fields.get("state"))
            if seen[1] == state:
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{rid} never reached {state} (last seen: {seen})")


async def test_a_caller_that_goes_away_cancels_its_request(http: Http) -> None:
    body = {"model": "auto", "messages": [{"role": "user", "content": "hold it"}]}
    async with httpx.AsyncClient(base_url=http.base_url, timeout=1.0) as raw:
        with pytest.raises(httpx.ReadTimeout):
            await raw.post("/chat/completions", json=body, headers={"X-Chimera-Request-Id": "gone-1"})
        await _wait_state(http, "gone-1", "cancelled")
        headers = {"X-Chimera-Request-Id": "gone-2"}
        async with raw.stream(
            "POST", "/chat/completions", json={**body, "stream": True}, headers=headers
        ) as r:
            assert r.status_code == 200
            first = await anext(r.aiter_lines())
            assert (
                first.startswith("data: ")
                and json.loads(first[6:])["choices"][0]["delta"]["role"] == "assistant"
            )
        await _wait_state(http, "gone-2", "cancelled")
    # Both were new programs that never answered: they are gone too.
    assert [k async for k in http.redis.scan_iter(match=http.keys.program_pattern())] == []


@pytest.mark.e2e
@pytest.mark.timeout(150)
def test_e2e_openai_client_runs_a_three_stage_workflow_against_the_stack(tmp_path: Path) -> None:
    with simulated_stack(tmp_path) as stack:
        client = openai.OpenAI(
            base_url=f"http://{stack.http_addr}/v1", api_key="unused", max_retries=0, timeout=60
        )
        assert [m.id for m in client.models.list().data][0] == "auto"
        placed = []
        for stage in range(3):
            headers = {
                "X-Chimera-Program-Id": "e2e-wf",
                "X-Chimera-Stage": str(stage),
                "X-Chimera-Workflow": "code/planner-coder",
                "X-Chimera-Request-Id": f"e2e-s{stage}",
            }
            messages: list[Any] = [
                {"role": "user", "content": f"stage {stage}: write a function that sorts a list"}
            ]
            if stage == 1:
                with client.chat.completions.with_streaming_response.create(
                    model="auto",
                    messages=messages,
                    max_tokens=48,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_headers=headers,
                ) as raw:
                    engine = raw.headers["x-chimera-engine"]
                    chunks = list(raw.parse())
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                usage = chunks[-1].usage
                assert usage is not None and usage.completion_tokens > 0 and text
                placed.append((chunks[-1].model, engine))
            else:
                resp = client.chat.completions.create(
                    model="auto", messages=messages, max_tokens=48, extra_headers=headers
                )
                assert resp.choices[0].message.content and resp.model_extra is not None
                placed.append((resp.model, resp.model_extra["chimera"]["engine"]))
        assert len(set(placed)) == 1
        engine = placed[0][1]
        r = redis.Redis.from_url(stack.redis_url, decode_responses=True)
        try:
            keys = Keys(stack.key_prefix)
            programs = {r.hget(keys.request(engine, f"e2e-s{i}"), "program_id") for i in range(3)}
            assert programs == {"e2e-wf"}
        finally:
            r.close()


@pytest.mark.unit
def test_every_domain_error_has_its_own_http_status() -> None:
    classes = [
        c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.DispatchError)
    ]
    codes = {c.code for c in classes if c is not errors.RequestFailed}
    assert codes <= set(HTTP_ERRORS)
    statuses = {code: domain_error(code, "x")[0] for code in codes}
    assert statuses == {
        "INTERNAL": 500,
        "INVALID_ARGUMENT": 400,
        "UNAUTHENTICATED": 401,
        "PERMISSION_DENIED": 403,
        "RESOURCE_EXHAUSTED": 413,
        "NOT_FOUND": 404,
        "FAILED_PRECONDITION": 409,
        "ALREADY_EXISTS": 409,
        "UNAVAILABLE": 503,
        "DEADLINE_EXCEEDED": 504,
    }
    # A worker's own failure code (RequestFailed) that has no entry is a server error, not a crash.
    assert domain_error("DATA_LOSS", "")[0] == 500


async def _raw(
    h: Http, body: bytes | dict[str, Any], headers: dict[str, str] | None = None
) -> httpx.Response:
    async with httpx.AsyncClient(base_url=h.base_url, timeout=20) as c:
        if isinstance(body, dict):
            return await c.post("/chat/completions", json=body, headers=headers)
        hs = {"content-type": "application/json", **(headers or {})}
        return await c.post("/chat/completions", content=body, headers=hs)


async def _http_state_keys(h: Http) -> set[str]:
    found = {k async for k in h.redis.scan_iter(match=f"{h.keys.prefix}:*", count=500)}
    return {k for k in found if ":req:" in k or ":prog:" in k}


CHAT: dict[str, Any] = {"model": "auto", "messages": MESSAGES}
WF = {"X-Chimera-Program-Id": "wf-lim"}


@pytest.mark.parametrize(
    ("body", "headers", "status", "needle"),
    [
        ({**CHAT, "messages": [{"role": "user", "content": "x"}] * 50_000}, {}, 413, "messages"),
        (CHAT, {**WF, "X-Chimera-Stage": "7"}, 400, "max_stage_skip"),
        (CHAT, {**WF, "X-Chimera-Stage": "9" * 20}, 400, "stage"),
        (CHAT, {**WF, "X-Chimera-Stage": "9" * 400}, 400, "stage"),
        (CHAT, {**WF, "X-Chimera-Stage": "-1"}, 400, "stage"),
        (CHAT, {"X-Chimera-Timeout-Ms": "9" * 400}, 400, "timeout_ms"),
        (CHAT, {"X-Chimera-Timeout-Ms": "9" * 20}, 400, "timeout_ms"),
        (CHAT, {"X-Chimera-Timeout-Ms": "soon"}, 400, "timeout_ms"),
        (CHAT, {"X-Chimera-Workflow": "w" * 201}, 400, "workflow"),
        (CHAT, {"X-Chimera-Workflow": "my workflow"}, 400, "workflow"),
        (CHAT, {"X-Chimera-Program-Id": "chimera:{e0}:queue"}, 400, "program_id"),
        (CHAT, {"X-Chimera-Request-Id": "r" * 201}, 400, "request_id"),
        ({**CHAT, "metadata": {"workflow": "w" * 100_000}}, {}, 413, "metadata"),
        ({**CHAT, "stop": [str(i) for i in range(17)]}, {}, 400, "stop"),
        ({**CHAT, "stop": "s" * 257}, {}, 400, "stop"),
        ({**CHAT, "stop": ["s" * 250] * 8}, {}, 413, "prompt"),
        (b'{"model":"auto","messages":[{"role":"user","content":"hi \\ud800"}]}', {}, 400, "surrogate"),
        (
            b'{"model":"auto","messages":[{"role":"user","content":"hi"}],"stop":"\\udfff"}',
            {},
            400,
            "surrogate",
        ),
        # pydantic itself refuses this one (a constrained str): still a 400 naming the field.
        (b'{"model":"\\ud800","messages":[{"role":"user","content":"hi"}]}', {}, 400, "model"),
        (
            b'{"model":"auto","messages":[{"role":"user","content":"hi"}],"metadata":{"k":"\\ud800"}}',
            {},
            400,
            "surrogate",
        ),
    ],
)
async def test_inputs_that_could_hurt_are_refused_and_leave_nothing(
    http: Http, body: bytes | dict[str, Any], headers: dict[str, str], status: int, needle: str
) -> None:
    resp = await _raw(http, body, headers)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert needle in error["message"]
    assert error["code"] == ("resource_exhausted" if status == 413 else "invalid_argument")
    assert await _http_state_keys(http) == set()


async def test_a_huge_body_is_413_before_it_is_parsed(http: Http) -> None:
    huge = b'{"model":"auto","messages":[{"role":"user","content":"' + b"x" * (9 * 2**20) + b'"}]}'
    declared = await _raw(http, huge)
    assert declared.status_code == 413 and declared.json()["error"]["code"] == "resource_exhausted"

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
        for i in range(0, len(huge), 2**20):
            yield huge[i : i + 2**20]

    async with httpx.AsyncClient(base_url=http.base_url, timeout=20) as c:
        chunked = await c.post(
            "/chat/completions", content=chunks(), headers={"content-type": "application/json"}
        )
    assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "resource_exhausted"
    assert await _http_state_keys(http) == set()


async def test_a_program_is_ended_over_http_and_its_outcome_kept(http: Http) -> None:
    headers = {"X-Chimera-Program-Id": "wf-end", "X-Chimera-Stage": "0", "X-Chimera-Workflow": "code/coder"}
    await http.client.chat.completions.create(model="auto", messages=MESSAGES, extra_headers=headers)
    assert await http.redis.exists(http.keys.program("wf-end"))
    async with httpx.AsyncClient(base_url=http.base_url) as c:
        ended = await c.post("/programs/wf-end/end", json={"outcome": 0.75})
        assert ended.status_code == 200 and ended.json()["found"] is True
        again = await c.post("/programs/wf-end/end")
        assert again.status_code == 200 and again.json()["found"] is False
        bad = await c.post("/programs/wf-end/end", json={"outcome": 2})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "outcome"
        assert (await c.post("/programs/bad%20id/end")).status_code == 400
    assert not await http.redis.exists(http.keys.program("wf-end"))
    rows = [json.loads(f["row"]) for _, f in await http.redis.xrange(http.keys.outcomes())]
    assert {"program_id": "wf-end", "outcome": 0.75}.items() <= next(
        r for r in rows if r["program_id"] == "wf-end"
    ).items()


ADD_TOOL: Any = {
    "type": "function",
    "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}},
}


async def test_a_request_that_may_call_a_tool_goes_only_to_engines_that_read_calls(http: Http) -> None:
    # e1 (m-big, where the fake router sends work) registers as an engine without a tool parser.
    await http.redis.hset(http.keys.engine_info("e1"), "tools", "0")
    raw = await http.client.chat.completions.with_raw_response.create(
        model="auto", messages=MESSAGES, tools=[ADD_TOOL]
    )
    assert raw.headers["x-chimera-engine"] == "e0"
    refused = await _error(
        http.client.chat.completions.create(model="m-big", messages=MESSAGES, tools=[ADD_TOOL])
    )
    assert refused.status_code == 400 and "'m-big' cannot call tools" in str(refused.message)
    # With no call possible, any engine serves it.
    raw = await http.client.chat.completions.with_raw_response.create(
        model="m-big", messages=MESSAGES, tools=[ADD_TOOL], tool_choice="none"
    )
    assert raw.headers["x-chimera-engine"] == "e1"
    await http.redis.hset(http.keys.engine_info("e0"), "tools", "0")
    none_can = await _error(
        http.client.chat.completions.create(model="auto", messages=MESSAGES, tools=[ADD_TOOL])
    )
    assert none_can.status_code == 400 and "no engine of the pool can call tools" in str(none_can.message)


async def test_a_streamed_turn_is_remembered_before_its_caller_sees_the_end(http: Http) -> None:
    # An agent sends its next turn the moment the stream ends: that turn must already find this one.
    stream = await http.client.chat.completions.with_raw_response.create(
        model="auto", messages=MESSAGES, stream=True
    )
    program = stream.headers["x-chimera-program-id"]
    text = "".join([c.choices[0].delta.content or "" async for c in stream.parse() if c.choices])
    turn = [*MESSAGES, {"role": "assistant", "content": text}, {"role": "user", "content": "more"}]
    raw = await http.client.chat.completions.with_raw_response.create(model="auto", messages=turn)
    assert (raw.headers["x-chimera-identity"], raw.headers["x-chimera-program-id"]) == (
        "continuation",
        program,
    )


async def test_a_loop_without_headers_reaches_the_predictor_with_its_state(http: Http) -> None:
    """A header-less conversation that offers tools is an open loop: its stages carry the loop's state (the
    turn, what the program attained, the last stage's output) to the predictor, as the request's payload."""
    first = await http.client.chat.completions.with_raw_response.create(
        model="auto", messages=MESSAGES, tools=[ADD_TOOL]
    )
    turns: list[Any] = [*MESSAGES, {"role": "assistant", "content": first.parse().choices[0].message.content}]
    turns.append({"role": "user", "content": "go on"})
    raw = await http.client.chat.completions.with_raw_response.create(
        model="auto", messages=turns, tools=[ADD_TOOL]
    )
    assert raw.headers["x-chimera-identity"] == "continuation"
    states = []
    for r in (first, raw):
        _, fields = await _request_fields(http, r.headers["x-chimera-request-id"])
        states.append(json.loads(fields["payload"])["loop"])
    # The fake worker answers 2 tokens per stage.
    assert states[0] == {
        "turn": 0,
        "attained_tokens": 0,
        "last_tool_failed": False,
        "last_tool_chars": 0,
        "last_output_tokens": 0,
    }
    assert states[1] == {
        "turn": 1,
        "attained_tokens": 2,
        "last_tool_failed": False,
        "last_tool_chars": 0,
        "last_output_tokens": 2,
    }
    # Without tools the same conversation is a chat, not a loop.
    plain = await http.client.chat.completions.with_raw_response.create(model="auto", messages=MESSAGES)
    _, fields = await _request_fields(http, plain.headers["x-chimera-request-id"])
    assert json.loads(fields["payload"])["loop"] is None


async def test_with_continuation_off_every_header_less_turn_is_a_new_program(
    private_redis: PrivateRedis, keys: Keys, redis_client: Redis
) -> None:
    await register_engines(redis_client, keys)
    async with (
        fake_workers(QueueStore(redis_client, keys)),
        fake_dependencies(private_redis, keys) as settings,
        dispatcher_server(
            settings.model_copy(update={"continuation": False}), redis_client, keys
        ) as grpc_server,
    ):
        server = HttpServer(OpenAIFrontDoor(grpc_server.dispatcher).app(), "127.0.0.1", 0, 1.0)
        port = await server.start()
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        try:
            first = await client.chat.completions.with_raw_response.create(model="auto", messages=MESSAGES)
            turns = [*MESSAGES, {"role": "assistant", "content": first.parse().choices[0].message.content}]
            again = await client.chat.completions.with_raw_response.create(
                model="auto", messages=[*turns, {"role": "user", "content": "and again"}]
            )
            assert [r.headers["x-chimera-identity"] for r in (first, again)] == ["new", "new"]
            assert first.headers["x-chimera-program-id"] != again.headers["x-chimera-program-id"]
            assert not [k async for k in redis_client.scan_iter(match=f"{keys.prefix}:conv:*")]
        finally:
            await client.close()
            await server.stop()
