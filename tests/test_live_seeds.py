"""``bench.live.seeds``: the live must-show pooled over traces, paired by workflow (pure; no engines)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.live.seeds import main, pool


def _trace(seed: int, runs: dict[str, list[tuple[float, float]]]) -> dict[str, Any]:
    """A ``real_live.json`` reduced to what pooling reads: per policy, (score, e2e seconds) by index."""
    return {
        "command": f"python -m bench.live --seed {seed}",
        "config": {"seed": seed},
        "runs": {
            name: {"workflows": [{"index": i, "score": s, "e2e_s": e} for i, (s, e) in enumerate(wfs)]}
            for name, wfs in runs.items()
        },
    }


def test_pooling_pairs_workflows_and_needs_every_trace() -> None:
    a = _trace(
        0,
        {
            "least-loaded": [(0, 10), (1, 20)],
            "chimera-tau0.5": [(1, 12), (1, 14)],
            "oracle": [(1, 1), (1, 1)],
        },
    )
    b = _trace(1, {"least-loaded": [(0, 30), (0, 40)], "chimera-tau0.5": [(0, 28), (1, 30)]})
    out = pool({"seed0": a, "seed1": b})
    assert set(out["policies"]) == {"least-loaded", "chimera-tau0.5"}  # oracle ran on one trace only
    v = out["verdicts"]["chimera-tau0.5"]
    assert v["score_gain"] == 0.5  # per workflow: +1, 0 (seed 0), 0, +1 (seed 1)
    assert v["e2e_mean_change_s"] == (2 - 6 - 2 - 10) / 4
    lo, hi = v["e2e_mean_change_90_s"]
    assert lo <= v["e2e_mean_change_s"] <= hi
    assert v["traces_holding"] == 2 and out["holds"] and out["best_tau"] == "chimera-tau0.5"


def test_a_slower_chimera_does_not_hold(tmp_path: Path) -> None:
    a = _trace(0, {"least-loaded": [(0, 10), (0, 20)], "chimera-tau2": [(1, 30), (1, 40)]})
    path = tmp_path / "t.json"
    path.write_text(json.dumps(a))
    assert main([str(path), "--out", str(tmp_path)]) == 0
    written = json.loads((tmp_path / "real_live_seeds.json").read_text())
    assert written["verdicts"]["chimera-tau2"]["scores_higher"] and not written["holds"]
    assert "does not hold" in (tmp_path / "real_live_seeds.md").read_text()
