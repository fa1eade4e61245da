"""Property-based fuzz of the gRPC door: ``Dispatcher.Generate`` with hypothesis-built ``GenerateRequest``s.

Requests mix served ones (a shared program id, its next stages, a served model) with hostile ones: every
code point in the strings (control characters, braces and globs in ids), huge numbers in every numeric
field, NaN and infinite floats, more messages than the limit, and bytes the generated stubs would never
send, written on the wire: a negative stage (a 64-bit varint in a uint32 field), a string that is not UTF-8,
a truncated message and plain garbage. Properties, over a fixed, derandomized budget:

- every status is one the README documents (OK, INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS,
  FAILED_PRECONDITION, RESOURCE_EXHAUSTED, UNAVAILABLE, DEADLINE_EXCEEDED); INTERNAL or UNKNOWN is a bug;
- no hang: each call ends within ``HANG_S`` and an accepted request drains from its engine;
- a refused request leaves Redis as it was (``fuzz_stack.residue``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from fuzz_stack import HANG_S, MAX_TOKENS, FuzzStack, Observer, Tally, fuzz_stack, residue
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from services.common.keys import Keys
from services.common.redis_proc import PrivateRedis
from services.dispatcher.openai_schema import HTTP_ERRORS
from services.dispatcher.server import SERVICE_NAME

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

EXAMPLES = 250
U32, U64 = 2**32 - 1, 2**64 - 1
# Client errors the README lists, and the two server errors it documents (UNAVAILABLE, DEADLINE_EXCEEDED).
DOCUMENTED = {
    "OK",
    "INVALID_ARGUMENT",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "FAILED_PRECONDITION",
    "RESOURCE_EXHAUSTED",
    "UNAVAILABLE",
    "DEADLINE_EXCEEDED",
}

# Every code point but lone surrogates, which a Python str holds but protobuf cannot encode (the wire
# mutations below send the bytes such a string would become).
odd_text = st.text(st.characters(codec="utf-8"), max_size=30)
served_text = st.sampled_from(["write a haiku", "sort a list", "  x  "])
ident = st.one_of(
    st.sampled_from(["fz-a", "fz-b", "fz-c"]),
    st.text("abc-_.:/@+={}*?[] \n", min_size=1, max_size=12),
    odd_text,
    st.just("i" * 201),
)
stage = st.one_of(st.integers(0, 6), st.integers(0, U32))
role = st.sampled_from(["system", "user", "user", "assistant", "tool", "", "USER"])
message = st.builds(pb.ChatMessage, role=role, content=st.one_of(served_text, odd_text))
valid_message = st.builds(
    pb.ChatMessage, role=st.sampled_from(["system", "user", "assistant"]), content=served_text
)
messages = st.one_of(
    st.lists(message, max_size=5),
    # Past the 1,000-message limit: RESOURCE_EXHAUSTED, whatever they hold.
    st.integers(1001, 3000).map(lambda n: [pb.ChatMessage(role="user", content="m")] * n),
)
float32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
sampling = st.builds(
    pb.SamplingParams,
    max_tokens=st.one_of(st.integers(0, MAX_TOKENS), st.integers(0, U32)),
    temperature=st.one_of(st.just(0.0), float32),
    top_p=st.one_of(st.just(0.0), float32),
    seed=st.one_of(st.none(), st.integers(0, U64)),
    stop=st.lists(st.one_of(st.just("."), odd_text, st.just("s" * 300)), max_size=4),
    top_k=st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)),
    min_p=st.one_of(st.none(), float32),
    repetition_penalty=st.one_of(st.none(), float32),
)
schema_text = st.one_of(
    st.just(""), st.just('{"type": "object"}'), st.just("[1]"), st.just("{not json"), odd_text
)
tool = st.builds(
    pb.Tool,
    name=st.one_of(st.sampled_from(["add", "get_weather"]), odd_text),
    description=odd_text,
    parameters_json=schema_text,
)
tool_choice = st.builds(
    pb.ToolChoice,
    mode=st.sampled_from(["", "auto", "none", "required", "function", "sometimes"]),
    function=st.sampled_from(["", "add", "mul"]),
)
response_format = st.builds(
    pb.ResponseFormat,
    type=st.sampled_from(["", "text", "json_object", "json_schema", "xml"]),
    schema_json=schema_text,
)
tool_message = st.builds(
    pb.ChatMessage,
    role=st.sampled_from(["assistant", "tool", "user"]),
    content=served_text,
    tool_calls=st.lists(st.builds(pb.ToolCall, id=ident, name=odd_text, arguments=schema_text), max_size=2),
    tool_call_id=st.one_of(st.just(""), ident),
)
hostile = st.builds(
    pb.GenerateRequest,
    tools=st.lists(tool, max_size=3),
    tool_choice=tool_choice,
    response_format=response_format,
    program_id=ident,
    stage=stage,
    workflow=st.one_of(st.sampled_from(["code/coder", "math/solver"]), odd_text),
    messages=st.one_of(messages, st.lists(tool_message, max_size=3)),
    sampling=sampling,
    request_id=st.one_of(st.just(""), ident),
    timeout_ms=st.one_of(st.just(0), st.integers(0, U32)),
    model=st.sampled_from(["", "auto", "m-small", "m-big", "m-huge", "{e0}", "\x00"]),
)
# Requests the door should serve (most do; a shared program id's stage may go backwards or skip ahead).
served = st.builds(
    pb.GenerateRequest,
    program_id=st.one_of(
        st.sampled_from(["fz-a", "fz-b", "fz-c"]), st.text("abcdef0123", min_size=10, max_size=10)
    ),
    stage=st.integers(0, 4),
    workflow=st.sampled_from(["code/coder", "math/solver", "code/planner-coder"]),
    messages=st.lists(valid_message, max_size=3).map(
        lambda ms: [*ms, pb.ChatMessage(role="user", content="go")]
    ),
    sampling=st.builds(
        pb.SamplingParams,
        max_tokens=st.integers(0, MAX_TOKENS),
        temperature=st.floats(0, 2, width=32),
        top_p=st.one_of(st.just(0.0), st.floats(0, 1, exclude_min=True, width=32)),
        seed=st.one_of(st.none(), st.integers(0, U64)),
        stop=st.lists(st.sampled_from([".", "END", "\n"]), max_size=2),
    ),
    tools=st.one_of(st.just([]), st.just([pb.Tool(name="add", parameters_json='{"type": "object"}')])),
    request_id=st.just(""),
    # 1-30 ms: a deadline that runs out while the request is queued or running.
    timeout_ms=st.one_of(st.just(0), st.just(0), st.integers(1, 30)),
    model=st.sampled_from(["", "auto", "m-small", "m-big"]),
)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


# What the generated stubs never send: (name, how the serialized request is changed).
# What the generated stubs never send, as changes to the serialized request; most cases go unchanged.
WIRE = st.sampled_from(["none"] * 6 + ["negative stage", "surrogate", "bad utf-8", "truncated", "garbage"])


def _on_the_wire(kind: str, data: bytes, cut: int, junk: bytes) -> bytes:
    if kind == "negative stage":  # field 2 (stage) as the 64-bit varint of -5: protobuf keeps its low 32 bits
        return data + b"\x10" + _varint(-5 & U64)
    if kind == "surrogate":  # field 1 (program_id) holding a lone surrogate as CESU-8 writes it
        return data + b"\x0a\x03\xed\xa0\x80"
    if kind == "bad utf-8":  # field 3 (workflow) holding a bare 0xff
        return data + b"\x1a\x01\xff"
    if kind == "truncated":
        return data[: max(0, len(data) - cut)]
    return junk if kind == "garbage" else data


@pytest.fixture
async def stack(private_redis: PrivateRedis, keys: Keys, redis_client: Redis) -> AsyncIterator[FuzzStack]:
    async with fuzz_stack(private_redis, keys, redis_client) as s:
        yield s


def _describe(req: pb.GenerateRequest, wire: str, outcome: str) -> str:
    text = str(req).replace("\n", " ")
    return f"wire={wire} {text[:300]!r} -> {outcome}"


def _fuzz(stack: FuzzStack) -> Tally:
    tally, observer = Tally("gRPC"), Observer(stack)
    channel = grpc.insecure_channel(stack.grpc_addr)
    # Bytes in, parsed responses out: the call sends whatever the case made of the serialized request.
    generate = channel.unary_stream(
        f"/{SERVICE_NAME}/Generate",
        request_serializer=None,
        response_deserializer=pb.GenerateResponse.FromString,
    )

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.one_of(served, hostile), WIRE, st.integers(1, 40), st.binary(min_size=1, max_size=64))
    def one(req: pb.GenerateRequest, name: str, cut: int, junk: bytes) -> None:
        before = observer.snapshot()
        started = time.monotonic()
        try:
            events = list(generate(_on_the_wire(name, req.SerializeToString(), cut, junk), timeout=HANG_S))
            code = "OK" if events and events[-1].HasField("final") else "NO_FINAL"
        except grpc.RpcError as e:
            code, events = e.code().name, []
        took = time.monotonic() - started
        status = 200 if code == "OK" else HTTP_ERRORS.get(code, (500, ""))[0]
        tally.count(status, code)
        if took >= HANG_S:
            tally.hangs.append(_describe(req, name, f"{code} after {took:.1f} s"))
        elif code not in DOCUMENTED:
            tally.undocumented_5xx.append(_describe(req, name, code))
        elif status >= 500:
            tally.documented_5xx += 1
        if code == "DEADLINE_EXCEEDED" or (code == "OK" and events):
            # Accepted (a deadline runs out only on a dispatched request): it must drain.
            if not observer.wait_idle():
                tally.hangs.append(_describe(req, name, f"{code}; its engine never drained"))
            else:
                tally.writes_seen += bool(residue(before, observer.snapshot()))
        else:
            added = residue(before, observer.snapshot())
            if added:
                tally.residue.append(_describe(req, name, f"{code} left {added[:5]}"))

    try:
        one()
    finally:
        observer.close()
        channel.close()
    return tally


async def test_grpc_door_fuzz(stack: FuzzStack, record_property: Any) -> None:
    tally = await asyncio.to_thread(_fuzz, stack)
    record_property("fuzz", tally.line())
    tally.check(min_ok=10)
