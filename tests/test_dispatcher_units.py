"""Pure pieces of the front door: input checks, proto conversion, engine parsing, quantiles, settings."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from services.common.snapshot import parse_engine
from services.common.types import ChatMessage, EngineProfile, SamplingParams, StageRequest
from services.dispatcher.clients import UpstreamError, prediction_from_quantiles
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.errors import InvalidRequest, RequestTooLarge
from services.dispatcher.intake import request_seed, stage_request
from services.dispatcher.server import intake_of
from services.dispatcher.validate import Limits, validate_request

pytestmark = pytest.mark.unit

LIMITS = Limits(max_tokens_limit=100, max_prompt_chars=50)
GOOD = StageRequest(
    request_id="r",
    program_id="p",
    stage=0,
    workflow="wf",
    messages=(ChatMessage("system", "s"), ChatMessage("user", "task")),
    sampling=SamplingParams(max_tokens=10),
)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"program_id": ""}, InvalidRequest),
        ({"program_id": "has space"}, InvalidRequest),
        ({"request_id": ""}, InvalidRequest),
        ({"workflow": "  "}, InvalidRequest),
        ({"messages": ()}, InvalidRequest),
        ({"messages": (ChatMessage("tool", "x"), ChatMessage("user", "t"))}, InvalidRequest),
        ({"messages": (ChatMessage("system", "only a system prompt"),)}, InvalidRequest),
        ({"sampling": SamplingParams(max_tokens=0)}, InvalidRequest),
        ({"sampling": SamplingParams(max_tokens=101)}, InvalidRequest),
        ({"sampling": SamplingParams(max_tokens=5, top_p=0.0)}, InvalidRequest),
        ({"sampling": SamplingParams(max_tokens=5, temperature=float("nan"))}, InvalidRequest),
        ({"messages": (ChatMessage("user", "x" * 51),)}, RequestTooLarge),
        ({"sampling": SamplingParams(max_tokens=5, stop=("",))}, InvalidRequest),
        ({"model_pin": "m" * 257}, InvalidRequest),
        ({"program_id": "acme~p~q"}, InvalidRequest),
    ],
)
def test_validation_refuses(change: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        validate_request(dataclasses.replace(GOOD, **change), LIMITS)  # type: ignore[arg-type]


def test_validation_accepts_limits_inclusive() -> None:
    validate_request(GOOD, LIMITS)
    validate_request(
        dataclasses.replace(GOOD, messages=(ChatMessage("user", "x" * 50),), sampling=SamplingParams(100)),
        LIMITS,
    )


def test_proto_conversion_fills_defaults() -> None:
    settings = DispatcherSettings(max_tokens_default=77)
    msg = pb.GenerateRequest(
        program_id="p",
        workflow="wf",
        messages=[pb.ChatMessage(role="user", content="hi")],
        model="auto",
        timeout_ms=1500,
    )
    req = stage_request(intake_of(msg), msg.stage, settings, now=1000.0)
    assert req.request_id and req.model_pin is None
    assert (req.sampling.max_tokens, req.sampling.top_p) == (77, 1.0)
    # No seed given: one from the request id, the same for every retry of it and for a re-run.
    assert req.sampling.seed == request_seed(req.request_id) == request_seed(str(req.request_id))
    assert request_seed("a") != request_seed("b") and 0 <= request_seed("a") < 2**31
    assert (req.received_unix, req.deadline_unix) == (1000.0, 1001.5)
    msg.model, msg.request_id, msg.timeout_ms = "m-7b", "given", 0
    msg.sampling.seed = 0
    req = stage_request(intake_of(msg), msg.stage, settings, now=5.0)
    assert (req.model_pin, req.request_id, req.deadline_unix, req.sampling.seed) == ("m-7b", "given", None, 0)


BASE = {
    "model": "m",
    "decode_ms_per_token": "10",
    "max_batch_size": "4",
    "heartbeat_ms": "100000",
    "load": "40",
}


@pytest.mark.parametrize(
    ("info", "now", "alive"),
    [
        (BASE, 100.0, True),
        (BASE, 115.0, True),  # exactly at the limit
        (BASE, 115.1, False),  # heartbeat too old
        ({**BASE, "model": ""}, 100.0, False),
        ({k: v for k, v in BASE.items() if k != "decode_ms_per_token"}, 100.0, False),
        ({**BASE, "max_batch_size": "", "max_num_seqs": "8"}, 100.0, True),
        ({**BASE, "decode_ms_per_token": "fast"}, 100.0, False),
    ],
)
def test_parse_engine_liveness(info: dict[str, str], now: float, alive: bool) -> None:
    snap = parse_engine("e", info, queued=2, running=1, now_unix=now, dead_after_s=15.0)
    assert snap.alive is alive
    assert (snap.queued, snap.running) == (2, 1)


def test_parse_engine_reads_load_and_profile() -> None:
    snap = parse_engine("e", BASE, 0, 0, 100.0, 15.0)
    assert (snap.inflight_tokens, snap.profile.decode_ms_per_token, snap.profile.max_batch_size) == (
        40,
        10.0,
        4,
    )


def test_parse_engine_carries_the_registered_step_curve_and_prefill_cost() -> None:
    full = EngineProfile(10.0, 4, 0.2, ((1, 10.0), (4, 16.0)))
    snap = parse_engine("e", {**BASE, "profile": full.to_json()}, 0, 0, 100.0, 15.0)
    assert snap.profile == full and snap.profile.step_time_ms(4) == 16.0
    # Without one, or unreadable, the engine still serves on its flat cost.
    for info in (BASE, {**BASE, "profile": "{not json"}):
        snap = parse_engine("e", info, 0, 0, 100.0, 15.0)
        assert snap.alive and snap.profile == EngineProfile(10.0, 4)


@pytest.mark.parametrize(
    ("qs", "vals", "expected"),
    [
        ([0.5, 0.9], [40.4, 99.6], (40, 100)),
        ([0.9, 0.5], [99.0, 40.0], (40, 99)),  # order follows the response's quantiles
        ([0.5], [12.0], (12, 12)),
        ([0.5, 0.9], [0.0, 0.0], (1, 1)),  # never 0: the request must count in the load
        ([0.5, 0.9], [50.0, 30.0], (50, 50)),  # p90 never below p50
    ],
)
def test_prediction_from_quantiles(qs: list[float], vals: list[float], expected: tuple[int, int]) -> None:
    p = prediction_from_quantiles(qs, vals)
    assert (p.p50, p.p90) == expected


@pytest.mark.parametrize(("qs", "vals"), [([0.9], [3.0]), ([0.5, 0.9], [1.0]), ([], [])])
def test_prediction_from_bad_quantiles(qs: list[float], vals: list[float]) -> None:
    with pytest.raises(UpstreamError):
        prediction_from_quantiles(qs, vals)


@pytest.mark.parametrize(
    "bad",
    [
        {"aging_rate": 0},
        {"tau": -1},
        {"delta_s": 1.5},
        {"policy": "nope"},
        {"max_tokens_default": 500, "max_tokens_limit": 100},
        {"port": 70000},
    ],
)
def test_settings_validation(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        DispatcherSettings(**bad)  # type: ignore[arg-type]


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHIMERA_DISPATCHER_TAU", "2.5")
    monkeypatch.setenv("CHIMERA_DISPATCHER_PORT", "6000")
    monkeypatch.setenv("CHIMERA_KEY_PREFIX", "xyz")
    s = DispatcherSettings()
    assert (s.tau, s.port, s.key_prefix, s.aging_rate) == (2.5, 6000, "xyz", 20.0)
