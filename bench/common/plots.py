"""Figures 3, 5 and 6 (and the oracle ablation of Fig. 7) as png, from a sweep's data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI
import matplotlib.pyplot as plt  # noqa: E402

LAT = "latency_per_token_ms"
BASELINE_STYLE = {"vllm": "s", "mlfq": "^", "ltr": "v", "vllm-stjf": "*", "stjf-learned": "P"}


def _line(ax: Any, node: Mapping[str, Any], label: str, style: str) -> None:
    pts = sorted((float(t), s[LAT], s["score"]) for t, s in node.items())
    ax.plot([p[1] for p in pts], [p[2] for p in pts], style, label=label, markersize=4)
    for t, x, y in pts:
        ax.annotate(f"{t:g}", (x, y), fontsize=5, alpha=0.6)


def _grid(
    data: Mapping[str, Any], dataset: str, series: Sequence[tuple[str, str]], baselines: bool, path: Path
) -> None:
    pools = data["frontier"][dataset]
    rps_keys = sorted({r for p in pools.values() for r in p}, key=float)
    fig, axes = plt.subplots(
        len(pools), len(rps_keys), figsize=(3.6 * len(rps_keys), 3.0 * len(pools)), squeeze=False
    )
    for i, (pool, by_rps) in enumerate(pools.items()):
        for j, rps in enumerate(rps_keys):
            ax = axes[i][j]
            cell = by_rps[rps]
            if baselines:
                for name, marker in BASELINE_STYLE.items():
                    s = cell[name]
                    ax.plot(s[LAT], s["score"], marker, label=name, markersize=7)
            for name, style in series:
                _line(ax, cell[name], name, style)
            ax.set_title(f"{dataset} {pool} RPS {rps}", fontsize=8)
            ax.set_xlabel("E2E latency per token (ms)", fontsize=7)
            ax.set_ylabel("score", fontsize=7)
            ax.tick_params(labelsize=6)
    axes[0][0].legend(fontsize=5, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fig3(data: Mapping[str, Any], section: str, dataset: str, path: Path) -> None:
    models = data[section][dataset]
    names = ("vllm", "ltr", "stjf-learned", "vllm-stjf")
    labels = ("FCFS", "SJF (per-stage ŷ)", "STJF (Chimera ŷ)", "STJF (oracle)")
    fig, axes = plt.subplots(1, len(models), figsize=(3.4 * len(models), 3.0), squeeze=False)
    for j, (model, by_rps) in enumerate(models.items()):
        ax = axes[0][j]
        rps_keys = sorted(by_rps, key=float)
        width = 0.8 / len(names)
        for k, (name, label) in enumerate(zip(names, labels, strict=True)):
            xs = [i + k * width for i in range(len(rps_keys))]
            ax.bar(xs, [by_rps[r][name]["queue_mean_s"] for r in rps_keys], width, label=label)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rps_keys))], [f"load {r}" for r in rps_keys])
        ax.set_title(f"{dataset}: {model} ({section})", fontsize=8)
        ax.set_ylabel("mean queue time (s)", fontsize=7)
        ax.tick_params(labelsize=6)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_all(data: Mapping[str, Any], out: Path) -> None:
    for d in data["frontier"]:
        _grid(data, d, (("chimera", "o-"), ("chimera-plus", "d--")), True, out / f"fig5_{d}.png")
        _grid(
            data,
            d,
            (
                ("chimera", "o-"),
                ("chimera-norouter", "x:"),
                ("chimera-oracle-router", "^-."),
                ("chimera-oracle-predictor", "s--"),
            ),
            False,
            out / f"fig6_{d}.png",
        )
    for section in ("fig3", "fig3_noaging"):
        for d in data.get(section, {}):
            _fig3(data, section, d, out / f"{section}_{d}.png")
