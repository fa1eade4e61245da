"""The live replay's results as types, their JSON form (bench/results/replay.json), and the report tables.

Kept apart from ``bench.sweep.replay`` so that the tables can be rewritten from a committed replay.json (and
tested) without the gRPC client and the services the live run needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, TypeVar

Metric = Literal["latency_per_token_ms", "score"]
# The metrics on which the two harnesses' orders of the policies are compared.
ORDER_METRICS: tuple[Metric, ...] = ("latency_per_token_ms", "score")


@dataclass(frozen=True, slots=True)
class LiveSummary:
    """One policy through the real services; latency in profile time, the overhead shares in real time."""

    latency_per_token_ms: float
    score: float
    dispatch_share_of_e2e: float
    router_share_of_e2e: float
    predictor_share_of_e2e: float
    # The policy's own computation plus its Redis round trips (assign, enqueue, reads).
    scheduler_share_of_e2e: float
    dispatch_ms_per_workflow: float
    share_7b: float


@dataclass(frozen=True, slots=True)
class SimSummary:
    """The same policy and jobs in the simulator replica."""

    latency_per_token_ms: float
    score: float
    share_7b: float


@dataclass(frozen=True, slots=True)
class PolicyResult:
    live: LiveSummary
    sim: SimSummary

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> PolicyResult:
        return PolicyResult(live=LiveSummary(**raw["live"]), sim=SimSummary(**raw["sim"]))


@dataclass(frozen=True, slots=True)
class OrderAgreement:
    """The policies in ascending order of one metric (means over seeds), live and simulated."""

    live: tuple[str, ...]
    sim: tuple[str, ...]
    agree: bool
    seeds_agree: tuple[bool, ...]  # the same comparison within each seed, in seed order


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """A whole replay: its parameters, every policy per seed and averaged, and the order checks."""

    n: int
    rps: float
    time_scale: float
    seeds: tuple[int, ...]
    dataset: str
    policies: Mapping[str, PolicyResult]  # means over seeds
    per_seed: Mapping[int, Mapping[str, PolicyResult]]
    orders: Mapping[Metric, OrderAgreement]
    command: str

    def to_dict(self) -> dict[str, Any]:
        """The replay.json form; its keys and their order are what earlier results were written with."""
        out: dict[str, Any] = {
            "n": self.n,
            "rps": self.rps,
            "time_scale": self.time_scale,
            "seeds": list(self.seeds),
            "dataset": self.dataset,
            "policies": _policies_dict(self.policies),
            "per_seed": {str(seed): _policies_dict(by) for seed, by in self.per_seed.items()},
        }
        for metric, o in self.orders.items():
            out[f"order_by_{metric}"] = {
                "live": list(o.live),
                "sim": list(o.sim),
                "agree": o.agree,
                "seeds_agree": list(o.seeds_agree),
            }
        out["command"] = self.command
        return out

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> ReplayResult:
        def agreement(o: Mapping[str, Any]) -> OrderAgreement:
            return OrderAgreement(tuple(o["live"]), tuple(o["sim"]), o["agree"], tuple(o["seeds_agree"]))

        return ReplayResult(
            n=raw["n"],
            rps=raw["rps"],
            time_scale=raw["time_scale"],
            seeds=tuple(raw["seeds"]),
            dataset=raw["dataset"],
            policies=_policies(raw["policies"]),
            per_seed={int(seed): _policies(by) for seed, by in raw["per_seed"].items()},
            orders={m: agreement(raw[f"order_by_{m}"]) for m in ORDER_METRICS},
            command=raw["command"],
        )


def _policies_dict(by_policy: Mapping[str, PolicyResult]) -> dict[str, Any]:
    return {name: asdict(r) for name, r in by_policy.items()}


def _policies(raw: Mapping[str, Any]) -> dict[str, PolicyResult]:
    return {name: PolicyResult.from_dict(r) for name, r in raw.items()}


def _value(summary: LiveSummary | SimSummary, metric: Metric) -> float:
    return summary.latency_per_token_ms if metric == "latency_per_token_ms" else summary.score


def orders(by_policy: Mapping[str, PolicyResult], metric: Metric) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The policies in ascending ``metric``: live, then simulated."""
    live = sorted(by_policy, key=lambda k: _value(by_policy[k].live, metric))
    sim = sorted(by_policy, key=lambda k: _value(by_policy[k].sim, metric))
    return tuple(live), tuple(sim)


_S = TypeVar("_S", LiveSummary, SimSummary)


def _mean_of(items: Sequence[_S]) -> _S:
    first = items[0]
    means = {f.name: sum(getattr(x, f.name) for x in items) / len(items) for f in fields(first)}
    return type(first)(**means)


def mean(runs: Sequence[Mapping[str, PolicyResult]]) -> dict[str, PolicyResult]:
    """Per policy and side, the mean of every metric over seeds."""
    return {
        name: PolicyResult(
            live=_mean_of([r[name].live for r in runs]), sim=_mean_of([r[name].sim for r in runs])
        )
        for name in runs[0]
    }


def flipped_pairs(policies: Mapping[str, PolicyResult], metric: Metric) -> list[tuple[str, str, float]]:
    """Policy pairs whose order on ``metric`` differs between live and sim, with |sim difference|."""
    names = list(policies)
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            live = _value(policies[a].live, metric) - _value(policies[b].live, metric)
            sim = _value(policies[a].sim, metric) - _value(policies[b].sim, metric)
            # A tie on one side only counts as a flip: the harnesses disagree on whether the two differ.
            if live * sim < 0 or (sim == 0) != (live == 0):
                out.append((a, b, abs(sim)))
    return out


def table(data: ReplayResult) -> str:
    seeds = ", ".join(str(s) for s in data.seeds)
    lines = [
        f"# Live replay vs simulator ({data.dataset}, Qwen1.5B+7B, {data.n} workflows per seed, "
        f"RPS {data.rps:g}, time_scale {data.time_scale:g}, seeds {seeds})",
        "",
        "Means over seeds.",
        "",
        "| policy | live ms/token | sim ms/token | live score | sim score | live 7B share | sim 7B share "
        "| dispatch ms per workflow |",
        "|" + "---|" * 8,
    ]
    for name, v in data.policies.items():
        lv, sm = v.live, v.sim
        lines.append(
            f"| {name} | {lv.latency_per_token_ms:.1f} | {sm.latency_per_token_ms:.1f} | "
            f"{lv.score:.3f} | {sm.score:.3f} | {lv.share_7b:.2f} | {sm.share_7b:.2f} | "
            f"{lv.dispatch_ms_per_workflow:.0f} |"
        )
    lines += [
        "",
        "## Table 1: overhead as a share of end-to-end workflow latency (live, real time)",
        "",
        "| policy | router | predictor | scheduler (policy + Redis) | all of dispatch | paper (all) |",
        "|" + "---|" * 6,
    ]
    for name, v in data.policies.items():
        shares = (
            v.live.router_share_of_e2e,
            v.live.predictor_share_of_e2e,
            v.live.scheduler_share_of_e2e,
            v.live.dispatch_share_of_e2e,
        )
        cells = " | ".join(f"{100 * s:.2f}%" for s in shares)
        lines.append(f"| {name} | {cells} | <= 2.2% |")
    lines += ["", "## Per seed (live / sim ms per token)", ""]
    lines.append("| seed | " + " | ".join(data.policies) + " |")
    lines.append("|" + "---|" * (len(data.policies) + 1))
    for seed, by in data.per_seed.items():
        row = [
            f"{by[k].live.latency_per_token_ms:.1f} / {by[k].sim.latency_per_token_ms:.1f}"
            for k in data.policies
        ]
        lines.append(f"| {seed} | " + " | ".join(row) + " |")
    for metric, o in data.orders.items():
        per = sum(o.seeds_agree)
        # Printed as lists, the form earlier reports (and readers) know.
        lines.append(
            f"\nOrder by {metric} (ascending, means over seeds): live {list(o.live)}, sim {list(o.sim)}: "
            f"agree = {o.agree} (per seed: {per} of {len(o.seeds_agree)} agree)."
        )
        flips = flipped_pairs(data.policies, metric)
        lines.append(
            "Pairs the two harnesses order differently (on the means), with the simulator's gap: "
            + (", ".join(f"{a} / {b} ({gap:.3g})" for a, b, gap in flips) or "none")
            + "."
        )
    return "\n".join(lines) + "\n"
