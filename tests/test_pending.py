"""The load a dispatcher routed but Redis cannot show yet (pending.py), with a fake clock."""

from __future__ import annotations

import pytest

from services.common.types import EngineProfile, EngineSnapshot
from services.dispatcher.pending import PendingLoad

pytestmark = pytest.mark.unit

PROFILE = EngineProfile(decode_ms_per_token=30.0, max_batch_size=4)
ENGINES = [EngineSnapshot("a", "m", PROFILE, 0), EngineSnapshot("b", "m", PROFILE, 100)]


def _loads(engines: list[EngineSnapshot]) -> dict[str, int]:
    return {e.engine_id: e.inflight_tokens for e in engines}


def test_a_choice_counts_for_every_snapshot_read_before_it_reached_redis() -> None:
    now = [0.0]
    pending = PendingLoad(clock=lambda: now[0])
    with pending.scope() as early:  # read its snapshot at 0
        with pending.scope() as first:
            first.take("a", 50)
            assert _loads(early.applied(ENGINES)) == {"a": 50, "b": 100}  # not enqueued yet
            now[0] = 1.0
            first.enqueued()
        assert _loads(early.applied(ENGINES)) == {"a": 50, "b": 100}  # enqueued after it read
        now[0] = 2.0
        with pending.scope() as late:  # reads Redis after the enqueue: its snapshot has it
            assert _loads(late.applied(ENGINES)) == {"a": 0, "b": 100}


def test_a_choice_that_was_refused_is_withdrawn() -> None:
    pending = PendingLoad(clock=lambda: 0.0)
    with pytest.raises(RuntimeError), pending.scope() as claim:
        claim.take("b", 70)
        raise RuntimeError("refused")
    assert pending.entries == []
    with pending.scope() as other:
        assert _loads(other.applied(ENGINES)) == {"a": 0, "b": 100}


def test_an_entry_is_dropped_once_every_dispatch_in_progress_read_after_it() -> None:
    now = [0.0]
    pending = PendingLoad(clock=lambda: now[0])
    with pending.scope() as slow:  # reads at 0, still in progress below
        for i in range(5):
            now[0] = 1.0 + i
            with pending.scope() as c:
                c.take("a", 10)
                c.enqueued()
        assert len(pending.entries) == 5  # the slow dispatch read before all of them
        assert _loads(slow.applied(ENGINES)) == {"a": 50, "b": 100}
    assert pending.entries == []  # nobody in progress: every later read sees them in Redis
    with pending.scope() as after:
        assert _loads(after.applied(ENGINES)) == {"a": 0, "b": 100}
