"""RemoteEngine pieces that need no server: the request body and what an unreachable server means."""

from __future__ import annotations

import socket

import pytest

from services.common.types import ChatMessage, SamplingParams, StageRequest
from services.worker.engine.base import EngineDeadError
from services.worker.engine.remote import RemoteEngine, RemoteEngineConfig, chat_body

pytestmark = pytest.mark.unit


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _req(rid: str, max_tokens: int = 16, **kw: object) -> StageRequest:
    return StageRequest(
        request_id=rid,
        program_id=rid,
        stage=0,
        workflow="test",
        messages=(ChatMessage("system", "Be brief."), ChatMessage("user", f"Say something about {rid}.")),
        sampling=SamplingParams(max_tokens=max_tokens, **kw),  # type: ignore[arg-type]
    )


def test_chat_body_carries_priority_and_sampling() -> None:
    req = _req("b", 9, temperature=0.3, top_p=0.8, seed=5, stop=("END",))
    body = chat_body(req, "m", priority=-4, send_priority=True)
    assert body["stream"] is True and body["model"] == "m"
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["priority"] == -4 and body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["seed"], body["stop"]) == (
        9,
        0.3,
        0.8,
        5,
        ["END"],
    )
    assert "priority" not in chat_body(req, "m", priority=1, send_priority=False)
    # vLLM's stream_interval goes only where asked: another OpenAI server sees a plain body.
    assert "stream_interval" not in body
    assert chat_body(req, "m", 1, False, stream_tokens=8)["stream_interval"] == 8


async def test_unreachable_server_is_a_dead_engine() -> None:
    eng = RemoteEngine(RemoteEngineConfig(base_url=f"http://127.0.0.1:{_free_port()}", start_timeout_s=1.0))
    with pytest.raises(EngineDeadError):
        await eng.start()
    await eng.stop()
