"""``bench.learned.real_merge``: the live and learning-loop summaries folded into ``real.json``."""

from __future__ import annotations

import json
from pathlib import Path

from bench.learned.real_merge import LEARN, LIVE, companions, markdown


def _side(score: float, mean: float) -> dict[str, object]:
    return {"score": score, "e2e_p50_s": mean, "e2e_mean_s": mean, "share": {"m": 1.0}, "failed": 0}


def test_missing_companions_are_reported_missing(tmp_path: Path) -> None:
    c = companions(tmp_path)
    assert c == {"live": None, "live_pooled": None, "learning_loop": None}
    text = "\n".join(markdown(c))
    assert "Not run yet (`make bench-live`" in text and "Not run yet (`make bench-learn`" in text


def test_live_frontier_and_verdict_are_copied(tmp_path: Path) -> None:
    live = {
        "command": "python -m bench.live",
        "config": {"tasks": 16, "workflow": "code/planner-coder", "rate": 0.12},
        "policies": {
            "least-loaded": {"live": _side(0.25, 60.0), "sim": _side(0.3, 70.0), "diff": {}},
            "chimera-tau2": {"live": _side(0.5, 55.0), "sim": None, "diff": None},
        },
        "must_show": {"live": {"best_tau": "chimera-tau2", "holds": True}},
    }
    (tmp_path / LIVE).write_text(json.dumps(live))
    (tmp_path / LEARN).write_text(
        json.dumps({"command": "python -m bench.learned.learn_live", "summary": {"x": 1}})
    )
    c = companions(tmp_path)
    assert c["live"]["frontier"]["chimera-tau2"] == {
        "live": {k: v for k, v in _side(0.5, 55.0).items() if k != "failed"}
    }
    assert c["learning_loop"]["summary"] == {"x": 1}
    text = "\n".join(markdown(c))
    assert "| chimera-tau2 | 0.500 | 55 | – | – |" in text
    assert "`chimera-tau2` **holds**" in text
