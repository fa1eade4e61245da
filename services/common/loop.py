"""The event loop a service runs on.

A stage wakes each process's loop dozens of times (gRPC completions, Redis replies, timers), and at low
concurrency every wakeup serves one event, so the loop's own cost per wakeup is a large share of a stage's
CPU (``bench/results/load_rates.md``). uvloop runs that machinery in C; the standard loop stays selectable
for debugging (its debug mode and tracebacks are the better ones).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

EventLoop = Literal["uvloop", "asyncio"]

T = TypeVar("T")


def loop_factory(kind: EventLoop) -> Callable[[], asyncio.AbstractEventLoop]:
    if kind == "uvloop":
        import uvloop  # imported here so that a process asking for the standard loop never loads it

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def run(main: Coroutine[Any, Any, T], kind: EventLoop) -> T:
    """``asyncio.run`` on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory(kind)) as runner:
        return runner.run(main)
