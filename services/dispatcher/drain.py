"""``DrainMeter``: how fast each engine's queue drains, measured, for the ``Retry-After`` of a refusal.

Every dispatch reads each engine's ``drained`` counter (predicted tokens released by finished, failed and
cancelled requests); the rate over the last ``window_s`` is what a refused caller is told to wait by. The
profile says how fast an engine *could* drain; this says how fast it *does* (a slow prompt mix, a busy GPU).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from services.common.types import EngineSnapshot


class DrainMeter:
    def __init__(self, window_s: float = 30.0, min_span_s: float = 1.0) -> None:
        self._window_s = window_s
        self._min_span_s = min_span_s
        self._samples: dict[str, deque[tuple[float, int]]] = {}

    def observe(self, engines: Sequence[EngineSnapshot], now: float) -> None:
        for e in engines:
            samples = self._samples.setdefault(e.engine_id, deque())
            if samples and e.drained_tokens < samples[-1][1]:
                samples.clear()  # the counter went back (Redis lost it): start over
            if not samples or now - samples[-1][0] >= 0.1:  # one sample per 100 ms is plenty
                samples.append((now, e.drained_tokens))
            while len(samples) > 2 and now - samples[1][0] >= self._window_s:
                samples.popleft()

    def rates(self) -> dict[str, float]:
        """Predicted tokens per second each engine released over the window (engines measured long enough)."""
        out = {}
        for engine, samples in self._samples.items():
            (t0, d0), (t1, d1) = samples[0], samples[-1]
            if t1 - t0 >= self._min_span_s:
                out[engine] = (d1 - d0) / (t1 - t0)
        return out
