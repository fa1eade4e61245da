"""Property-based fuzz of the HTTP door, driven by its own ``/openapi.json`` (schemathesis).

Every operation of the served schema gets cases that fit it and, for the generation routes, cases that
break it (schemathesis' negative mode: wrong types, missing fields, values past the documented limits,
bad identity headers). Properties, over a fixed, derandomized budget:

- no server error the schema does not document (503 and 504 are; a 500, or an ``internal`` error event in
  a stream, is a bug);
- no hang: each call answers within ``HANG_S`` and an accepted request drains from its engine;
- a refused request (4xx, 503) leaves Redis as it was (``fuzz_stack.residue``).

Two thirds of the cases are steered towards being served (a served model, a user task), some share a
program id and some carry a short deadline, so that valid cases get dispatched, run multi-stage programs and
run out of time, rather than all ending as 404s. Each test runs its budget in a few seconds per hundred
cases on a 2-core machine (``EXAMPLES``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
import requests
import schemathesis
from fuzz_stack import HANG_S, FuzzStack, Observer, Tally, fuzz_stack, residue
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from schemathesis import Case, GenerationMode

from services.common.keys import Keys
from services.common.redis_proc import PrivateRedis
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.http_api import OpenAIFrontDoor
from services.dispatcher.http_doc import GENERATION_PATHS

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

EXAMPLES = 200
# How a case is steered towards being served (None: left as generated).
MODELS = st.sampled_from([None, "auto", "m-small"])
PROGRAMS = st.sampled_from([None, None, "fz-a", "fz-b"])
# A deadline that runs out while the request is queued or running (504, or an error event in a stream).
TIMEOUTS = st.sampled_from([None, None, None, None, "1", "15"])
TASK = {"role": "user", "content": "write a haiku about queues"}


@pytest.fixture
async def stack(private_redis: PrivateRedis, keys: Keys, redis_client: Redis) -> AsyncIterator[FuzzStack]:
    async with fuzz_stack(private_redis, keys, redis_client) as s:
        yield s


def _steer(case: Case, model: str | None, program: str | None, timeout: str | None) -> None:
    """Make a generated case likelier to be served: a served model, a user task (the one rule of a valid
    chat body a schema cannot state), a shared program id whose next stage it runs, a short deadline."""
    body = case.body
    if model is not None and isinstance(body, dict):
        body["model"] = model
        if isinstance(body.get("messages"), list):
            body["messages"].append(TASK)
        if "prompt" in body and not (isinstance(body["prompt"], str) and body["prompt"].strip()):
            body["prompt"] = TASK["content"]
    if program is not None and case.path in GENERATION_PATHS:
        case.headers = {**(case.headers or {}), "X-Chimera-Program-Id": program}
        case.headers.pop("X-Chimera-Stage", None)
    if timeout is not None and case.path in GENERATION_PATHS:
        case.headers = {**(case.headers or {}), "X-Chimera-Timeout-Ms": timeout}


def _stream_errors(resp: requests.Response) -> list[str]:
    """Codes of the ``error`` events of a server-sent stream."""
    codes = []
    for line in resp.text.splitlines():
        if line.startswith("data: {"):
            event = json.loads(line[6:])
            if "error" in event:
                codes.append(str(event["error"].get("code")))
    return codes


def _describe(case: Case, status: object, text: str = "") -> str:
    headers = {k: v for k, v in (case.headers or {}).items() if k.lower().startswith("x-chimera")}
    return (
        f"{case.method} {case.path} headers={headers} body={str(case.body)[:300]!r} -> {status} {text[:200]}"
    )


def _fuzz(stack: FuzzStack) -> Tally:
    doc = requests.get(f"{stack.http_url}/openapi.json", timeout=HANG_S).json()
    schema = schemathesis.openapi.from_dict(doc)
    ops = [op.ok() for op in schema.get_all_operations()]
    generation = [op for op in ops if op.path in GENERATION_PATHS]
    others = [op.as_strategy(GenerationMode.POSITIVE) for op in ops if op not in generation]
    # Weighted towards the routes with bodies and headers: each gets positive and negative cases, and the
    # bodiless GET routes together get a ninth.
    cases = st.one_of(
        *[op.as_strategy(mode) for op in generation for mode in GenerationMode for _ in range(2)],
        st.one_of(others),
    )
    documented_5xx = {
        (path, int(code))
        for path, item in doc["paths"].items()
        for op in item.values()
        for code in op["responses"]
        if code.isdigit() and int(code) >= 500
    }
    tally, observer, session = Tally("HTTP"), Observer(stack), requests.Session()

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(cases, MODELS, PROGRAMS, TIMEOUTS)
    def one(case: Case, model: str | None, program: str | None, timeout: str | None) -> None:
        _steer(case, model, program, timeout)
        before = observer.snapshot()
        started = time.monotonic()
        try:
            resp = case.call(base_url=stack.http_url, session=session, timeout=HANG_S)
        except requests.Timeout:
            tally.count(0, "timeout")
            tally.hangs.append(_describe(case, "no answer"))
            return
        took = time.monotonic() - started
        status = resp.status_code
        tally.count(status)
        if took > HANG_S:
            tally.hangs.append(_describe(case, status, f"after {took:.1f} s"))
        if status >= 500:
            if (case.path, status) in documented_5xx:
                tally.documented_5xx += 1
            else:
                tally.undocumented_5xx.append(_describe(case, status, resp.text))
        if status < 300 and "internal" in _stream_errors(resp):
            tally.undocumented_5xx.append(_describe(case, "stream error internal", resp.text))
        if 400 <= status < 500 or status == 503:
            added = residue(before, observer.snapshot())
            if added:
                tally.residue.append(_describe(case, status, f"left {added[:5]}"))
        elif not observer.wait_idle():
            tally.hangs.append(_describe(case, status, "its engine never drained"))
        elif status < 300 and case.path in GENERATION_PATHS:
            tally.writes_seen += bool(residue(before, observer.snapshot()))

    try:
        one()
    finally:
        observer.close()
        session.close()
    return tally


async def test_http_door_fuzz(stack: FuzzStack, record_property: Any) -> None:
    tally = await asyncio.to_thread(_fuzz, stack)
    record_property("fuzz", tally.line())
    tally.check(min_ok=10)


@pytest.mark.unit
def test_the_schema_documents_headers_limits_and_only_503_and_504() -> None:
    settings = DispatcherSettings(max_tokens_limit=300, max_messages=7)
    doc = OpenAIFrontDoor(SimpleNamespace(settings=settings)).app().openapi()  # type: ignore[arg-type]
    for path in GENERATION_PATHS:
        op = doc["paths"][path]["post"]
        assert {p["name"] for p in op["parameters"]} == {
            "X-Chimera-Program-Id",
            "X-Chimera-Stage",
            "X-Chimera-Workflow",
            "X-Chimera-Request-Id",
            "X-Chimera-Timeout-Ms",
        }
        assert {c for c in op["responses"] if c.startswith("5")} == {"503", "504"}
        assert "422" not in op["responses"]  # validation errors are 400, as the door answers them
    chat = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert chat["messages"]["maxItems"] == 7
    assert {"type": "integer", "minimum": 1, "maximum": 300} in chat["max_tokens"]["anyOf"]
    # The schema a fuzzer (or a client generator) loads is a valid OpenAPI document.
    assert len(list(schemathesis.openapi.from_dict(doc).get_all_operations())) == 6
