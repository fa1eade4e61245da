"""The stream hub's blocking read on a Redis Cluster: one XREAD per notify stream, each kept open across
the hub's rounds.

NOTE(cluster-read): Redis Cluster refuses a command whose keys lie in different slots, even slots of one
node, and each engine's notify stream is in its engine's slot (``Keys.notify``): the hub's single XREAD over
every engine cannot be sent. So each engine gets its own blocking XREAD, on its own connection to the
master that owns its slot: one connection per engine the process streams from (a handful: engines, not
requests), the fewest that lets every engine's events arrive as they happen. A round ends when any read
answers; the reads still blocked stay open into the next round (re-sending them would cost a round trip
per engine per event), and a read on a new engine joins without cutting the others short.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from redis.asyncio import Redis
from redis.typing import KeyT, StreamIdT


class SlotReads:
    def __init__(self, reader: Redis, block_ms: int, count: int) -> None:
        self._reader = reader
        self._block_ms = block_ms
        self._count = count
        self._open: dict[KeyT, asyncio.Task[Any]] = {}  # notify stream -> its blocked read

    async def read(self, cursor: Mapping[KeyT, StreamIdT], interrupt: asyncio.Event) -> list[Any]:
        """XREAD's answer (``[[stream, entries], ...]``) for the streams whose read returned, after waiting
        until one does, its block ends, or ``interrupt`` is set. A read's error is raised here."""
        for stream in [s for s in self._open if s not in cursor]:
            self._open.pop(stream).cancel()
        for stream, since in cursor.items():
            if stream not in self._open:
                read = self._reader.xread({stream: since}, block=self._block_ms, count=self._count)
                task = asyncio.ensure_future(read)
                # A read cancelled later (its engine forgotten, the hub stopping) may fail as its connection
                # drops: expected, so its error is retrieved rather than reported as never retrieved.
                task.add_done_callback(lambda t: t.cancelled() or t.exception())
                self._open[stream] = task
        woken = asyncio.ensure_future(interrupt.wait())
        try:
            await asyncio.wait({woken, *self._open.values()}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
        out: list[Any] = []
        for stream, task in list(self._open.items()):
            if task.done():
                del self._open[stream]
                out.extend(task.result() or [])
        return out

    async def close(self) -> None:
        tasks = list(self._open.values())
        self._open.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
