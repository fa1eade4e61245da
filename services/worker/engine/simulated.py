"""The simulated engine: a MEASURING INSTRUMENT for benchmarks, not an LLM and not a stand-in for vLLM.

NOTE(simulated): it reproduces the one property of vLLM that scheduling results depend on, continuous
batching with a measured step time, and nothing else:

- one step loop; each step every running sequence (at most ``max_num_seqs``) gets one token;
- a step takes ``profile.step_time_ms(batch)`` plus ``profile.prefill_ms_per_token`` for every prompt token
  of the sequences admitted in that step, divided by ``time_scale`` (10 runs ten times faster than the
  profiled engine: benchmarks compress time, and every duration they report is scaled back);
- sequences beyond ``max_num_seqs`` wait inside the engine, lowest ``priority`` first (vLLM's priority
  scheduling), though the worker's admission control keeps that waiting list at most ``prefetch`` long;
- output length comes from a pluggable ``LengthModel``, capped by ``sampling.max_tokens``; the text is
  filler recycled from the prompt's own words (see ``simulated_inputs``).

A test that claims the real path works must never use this engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from services.common.chat import ToolCall, ToolCallPiece
from services.common.types import EngineProfile, StageRequest
from services.worker.engine.base import EngineDeadError, EngineOutput
from services.worker.engine.simulated_inputs import (
    LengthModel,
    LognormalLengths,
    count_prompt_tokens,
    filler_token,
    filler_words,
    simulated_call,
)

log = logging.getLogger(__name__)

# If the loop falls further behind its schedule than this (a busy machine), it restarts the schedule from
# now instead of running steps back to back to catch up, which would fake a burst of throughput.
_MAX_LAG_S = 0.05


@dataclass(eq=False)
class _Seq:
    key: str
    priority: int
    arrival: int  # admission counter: FCFS among equal priorities
    target: int  # tokens it will produce
    finish_reason: str  # "length" when max_tokens capped the target, else "stop"
    prompt_tokens: int
    words: tuple[str, ...]
    offset: int
    out: asyncio.Queue[EngineOutput | BaseException] = field(default_factory=asyncio.Queue)
    produced: int = 0
    held: str = ""  # text produced but not yet sent (stream_tokens > 1, or not streamed)
    every: int = 1  # text goes out every this many tokens (the first at once); 0: only at the end
    call: ToolCall | None = None  # the call it answers with instead of filler (simulated_call)


class SimulatedEngine:
    """Continuous batching on a profiled clock (a measuring instrument; see the module docstring)."""

    kind = "simulated"

    def __init__(
        self,
        model: str,
        profile: EngineProfile,
        max_num_seqs: int | None = None,
        time_scale: float = 1.0,
        lengths: LengthModel | None = None,
        fault_die_after_s: float | None = None,
        stream_tokens: int = 1,
        fault_die_file: str = "",
        max_model_len: int = 2048,
    ) -> None:
        """``fault_die_after_s`` and ``fault_die_file`` are FAULT INJECTION for tests: the step loop dies that
        long after start, or once that file appears, as a real engine process would (running requests
        fail with EngineDeadError; health() says why)."""
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.model = model
        self.max_num_seqs = max_num_seqs or profile.max_batch_size
        self.calls_tools = True  # placeholder calls (simulated_inputs.simulated_call)
        self.time_scale = time_scale
        self.max_model_len = max_model_len
        self.stream_tokens = max(1, stream_tokens)  # as vLLM's stream_interval: the first token at once
        self._profile = profile
        self._lengths: LengthModel = lengths or LognormalLengths()
        self._waiting: list[_Seq] = []
        self._running: dict[str, _Seq] = {}
        self._by_key: dict[str, _Seq] = {}
        self._arrivals = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._fault_die_after_s = fault_die_after_s
        self._fault: asyncio.TimerHandle | None = None
        self._fault_file = Path(fault_die_file) if fault_die_file else None
        self._fault_watch: asyncio.Task[None] | None = None
        self._died: str | None = None
        # Instrument readings, for tests and benchmarks.
        self.steps = 0
        self.max_batch_seen = 0
        self.late_steps = 0  # steps that started over _MAX_LAG_S late: the clock was not kept
        self.admission_log: deque[str] = deque(maxlen=4096)

    async def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop(), name=f"simulated-engine-{self.model}")
            self._died = None
            if self._fault_die_after_s is not None:
                self._fault = asyncio.get_running_loop().call_later(self._fault_die_after_s, self.kill)
            if self._fault_file is not None:
                self._fault_watch = asyncio.create_task(self._watch_fault_file(self._fault_file))
            log.info(
                "simulated engine (a measuring instrument) for %s: max_num_seqs=%d time_scale=%g profile=%s",
                self.model,
                self.max_num_seqs,
                self.time_scale,
                self._profile.to_json(),
            )

    def kill(self, reason: str = "fault injection: the simulated engine was killed") -> None:
        """Die as an engine process does (tests): the step loop stops and every request fails."""
        if self._task is None or self._task.done():
            return
        log.error("simulated engine %s: %s", self.model, reason)
        self._died = reason
        self._task.cancel()
        self._fail_all(EngineDeadError(reason))

    async def health(self) -> str | None:
        if self._died is not None:
            return self._died
        if self._task is None:
            return "simulated engine is not started"
        if self._task.done():
            return "simulated engine step loop stopped"
        return None

    async def _watch_fault_file(self, path: Path) -> None:
        """FAULT INJECTION: die as soon as ``path`` appears, which a benchmark creates at the moment it
        chooses (mid-load), and remove it: one shot, so the restarted engine lives."""
        while self._task is not None and not self._task.done():
            if path.exists():
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                self.kill(f"fault injection: the simulated engine was killed ({path.name} appeared)")
                return
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self._fault is not None:
            self._fault.cancel()
            self._fault = None
        if self._fault_watch is not None:
            self._fault_watch.cancel()
            self._fault_watch = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = None
        self._fail_all(EngineDeadError("simulated engine stopped"))

    def running(self) -> int:
        return len(self._by_key)

    def profile(self) -> EngineProfile:
        return self._profile

    async def generate(self, request: StageRequest, key: str, priority: int) -> AsyncIterator[EngineOutput]:
        if self._task is None or self._task.done():
            raise EngineDeadError("simulated engine is not running")
        if key in self._by_key:
            raise ValueError(f"request key {key!r} is already running")
        seq = self._new_seq(request, key, priority)
        self._waiting.append(seq)
        self._by_key[key] = seq
        self._wake.set()
        try:
            while True:
                item = await seq.out.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            # The consumer stopped early (closed the generator or was cancelled): free the slot.
            if self._by_key.get(key) is seq:
                self._remove(seq)

    async def abort(self, key: str) -> None:
        seq = self._by_key.get(key)
        if seq is None:
            return
        self._remove(seq)
        seq.out.put_nowait(
            EngineOutput(
                "", True, "cancelled", prompt_tokens=seq.prompt_tokens, completion_tokens=seq.produced
            )
        )

    def _new_seq(self, request: StageRequest, key: str, priority: int) -> _Seq:
        call = simulated_call(request)
        # A call's length is its arguments' (about four characters a token, the first token its name).
        wanted = 1 + len(call.arguments) // 4 if call else max(1, int(self._lengths(request)))
        prompt = request.prompt_text()
        prompt_tokens = count_prompt_tokens(prompt)
        # A request without max_tokens runs to the end of the context, as a real engine would.
        room = max(1, self.max_model_len - prompt_tokens)
        cap = room if request.sampling.to_context else max(1, request.sampling.max_tokens)
        # Start the filler at a stage-dependent word so that concurrent streams do not all read alike (and a
        # retried stage reads the same).
        stage_key = f"{request.program_id}\x1f{request.stage}".encode()
        offset = int.from_bytes(hashlib.blake2b(stage_key, digest_size=4).digest(), "big")
        self._arrivals += 1
        return _Seq(
            key=key,
            priority=priority,
            arrival=self._arrivals,
            target=min(wanted, cap),
            finish_reason="length" if wanted > cap else "stop",
            prompt_tokens=prompt_tokens,
            words=filler_words(prompt),
            offset=offset,
            call=call,
            every=self.stream_tokens if request.stream else 0,
        )

    def _remove(self, seq: _Seq) -> None:
        self._by_key.pop(seq.key, None)
        self._running.pop(seq.key, None)
        with contextlib.suppress(ValueError):
            self._waiting.remove(seq)

    def _admit(self) -> list[_Seq]:
        admitted: list[_Seq] = []
        while self._waiting and len(self._running) < self.max_num_seqs:
            best = min(self._waiting, key=lambda s: (s.priority, s.arrival))
            self._waiting.remove(best)
            self._running[best.key] = best
            self.admission_log.append(best.key)
            admitted.append(best)
        return admitted

    def _step_seconds(self, batch: int, admitted: list[_Seq]) -> float:
        ms = self._profile.step_time_ms(batch)
        ms += self._profile.prefill_ms_per_token * sum(s.prompt_tokens for s in admitted)
        return ms / 1000.0 / self.time_scale

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            due = loop.time()
            while True:
                if not self._by_key:
                    self._wake.clear()
                    await self._wake.wait()
                    due = loop.time()
                admitted = self._admit()
                batch = list(self._running.values())
                if not batch:
                    continue
                self.max_batch_seen = max(self.max_batch_seen, len(batch))
                # Sleep until the step's due time (not for its duration) so that scheduling overhead does
                # not accumulate into a slower clock than the profile says.
                due += self._step_seconds(len(batch), admitted)
                lag = loop.time() - due
                if lag > _MAX_LAG_S:
                    due = loop.time()
                    self.late_steps += 1
                    if self.late_steps % 1000 == 1:
                        log.warning(
                            "simulated engine (a measuring instrument) %s runs %.0f ms behind its profile "
                            "(%d late steps): the host cannot keep up at time_scale=%g, so measured "
                            "throughput is lower than the profile's",
                            self.model,
                            lag * 1000,
                            self.late_steps,
                            self.time_scale,
                        )
                await asyncio.sleep(max(0.0, due - loop.time()))
                self.steps += 1
                for seq in batch:
                    if self._running.get(seq.key) is seq:  # not aborted during the step
                        self._emit(seq)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in the instrument: fail every request rather than hang them
            log.exception("simulated engine step loop crashed")
            self._died = f"simulated engine crashed: {exc!r}"
            self._fail_all(EngineDeadError(f"simulated engine crashed: {exc!r}"))

    def _emit(self, seq: _Seq) -> None:
        if seq.call is not None:
            self._emit_call(seq, seq.call)
            return
        text = seq.held + filler_token(seq.words, seq.offset, seq.produced)
        seq.produced += 1
        if seq.produced < seq.target:
            if seq.every and (seq.produced == 1 or seq.produced % seq.every == 0):
                seq.held = ""
                seq.out.put_nowait(EngineOutput(text))
            else:
                seq.held = text
            return
        self._remove(seq)
        seq.out.put_nowait(
            EngineOutput(text, True, seq.finish_reason, seq.prompt_tokens, completion_tokens=seq.produced)
        )

    def _emit_call(self, seq: _Seq, call: ToolCall) -> None:
        """One token of a call: its id and name first, then four characters of its arguments a token; the
        last token brings the rest, or, cut short by max_tokens, leaves the call unfinished (no call)."""
        i, args = seq.produced, call.arguments
        seq.produced += 1
        last = seq.produced >= seq.target
        whole = last and seq.target >= 1 + len(args) // 4
        end = len(args) if whole else 4 * i
        first = i == 0
        piece = ToolCallPiece(
            0, call.id if first else "", call.name if first else "", args[max(0, 4 * i - 4) : end]
        )
        if not last:
            if seq.every:
                seq.out.put_nowait(EngineOutput("", tool_pieces=(piece,)))
            return
        self._remove(seq)
        done = EngineOutput(
            "",
            True,
            seq.finish_reason,
            seq.prompt_tokens,
            completion_tokens=seq.produced,
            tool_pieces=(piece,),
            tool_calls=(call,) if whole else (),
        )
        seq.out.put_nowait(done)

    def _fail_all(self, exc: BaseException) -> None:
        for seq in list(self._by_key.values()):
            self._remove(seq)
            seq.out.put_nowait(exc)
