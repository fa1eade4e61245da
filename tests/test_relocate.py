"""Where a later stage goes when its program's engine is dead (pure policy, no Redis)."""

from __future__ import annotations

import pytest

from services.common.types import EngineProfile, EngineSnapshot
from services.policy.contract import NoLiveEngine
from services.policy.routing import Assignment, relocate

pytestmark = pytest.mark.unit

PROFILE = EngineProfile(decode_ms_per_token=10.0, max_batch_size=4)


def _eng(eid: str, model: str, load: int, alive: bool = True) -> EngineSnapshot:
    return EngineSnapshot(eid, model, PROFILE, inflight_tokens=load, alive=alive)


DEAD = Assignment("big-0", "big", 2)


def test_another_engine_of_the_same_model_wins_over_any_other_model() -> None:
    pool = [_eng("big-0", "big", 0, alive=False), _eng("small", "small", 0), _eng("big-1", "big", 900)]
    route = relocate("p", DEAD, pool, {"big": 0.9, "small": 0.95}, margin=0.1)
    assert (route.engine_id, route.model, route.branch) == ("big-1", "big", "moved")


def test_the_least_loaded_of_the_close_models_takes_it() -> None:
    pool = [
        _eng("big-0", "big", 0, alive=False),
        _eng("mid-0", "mid", 500),
        _eng("mid-1", "mid", 100),
        _eng("tiny", "tiny", 0),
    ]
    route = relocate("p", DEAD, pool, {"big": 0.9, "mid": 0.85, "tiny": 0.3}, margin=0.1)
    assert route.engine_id == "mid-1"


def test_nothing_close_enough_names_the_dead_engine() -> None:
    pool = [_eng("big-0", "big", 0, alive=False), _eng("tiny", "tiny", 0), _eng("big-2", "big", 0, False)]
    with pytest.raises(NoLiveEngine, match="'big-0'"):
        relocate("p", DEAD, pool, {"big": 0.9, "tiny": 0.3}, margin=0.1)
    with pytest.raises(NoLiveEngine):  # no confidences kept (a pinned program): only the same model
        relocate("p", DEAD, pool, {}, margin=1.0)
