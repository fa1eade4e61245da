"""The predictor of open agent loops: quantiles of what remains of a loop whose length nobody knows.

A fixed workflow has a name and a stage index the workflow forests learn from; an agent loop (the model
calls a tool, the result comes back as the next call) has neither. What a scheduler does know when the
loop's next stage waits is ``LoopState``: the turn, the output tokens so far, whether the tool results it
answers failed and how long they are, the previous turn's output, and the model. One quantile regression
forest (``quantile-forest``, as the workflow forests) over those and a column per model learns the output
tokens of this turn and every later one from real loops (``bench/data/agent/loops.jsonl``, ``make
collect-agent``).

What is left out on purpose: the stage's prompt length. The collected loops hold the engine's own token
count, which the dispatcher does not have before the stage runs (it would count ``approx_tokens``, about
20% off), so a forest trained on one and served the other would split on a skewed feature. Without it the
forest orders the held-out loops at Kendall-tau distance 0.158 against 0.135 with it
(``bench/results/agent_loops.md`` gives both).

Why raw tokens and not log1p as the workflow forests: loops are short (a few turns of tens to hundreds of
tokens), without the runaway tails that made the log target necessary there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from quantile_forest import RandomForestQuantileRegressor

from services.common.types import LoopState

FEATURES = ("turn", "attained_tokens", "last_tool_failed", "last_tool_chars", "last_output_tokens")


@dataclass(frozen=True, slots=True)
class LoopMoment:
    """One waiting turn of one recorded loop, and what remained after it."""

    problem_id: str
    model: str
    state: LoopState
    prompt_tokens: int  # the engine's count: not a feature (see the module's docstring)
    output: int  # this turn's output tokens
    remaining: int  # output tokens of this turn and every later one


def read_loops(path: Path) -> list[dict[str, Any]]:
    """The loop records of a ``loops.jsonl``; none when the file is absent."""
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def loop_moments(rows: Sequence[Mapping[str, Any]]) -> list[LoopMoment]:
    """Every turn of every loop record (``services.agent.coding.AgentRun.record``) as a moment."""
    out = []
    for r in rows:
        turns = r["turns"]
        outputs = [int(t["completion_tokens"]) for t in turns]
        for k, t in enumerate(turns):
            prev = turns[k - 1] if k else None
            state = LoopState(
                turn=k,
                attained_tokens=sum(outputs[:k]),
                last_tool_failed=bool(prev and not prev["passed"]),
                last_tool_chars=int(prev["tool_result_chars"]) if prev else 0,
                last_output_tokens=outputs[k - 1] if k else 0,
            )
            out.append(
                LoopMoment(
                    str(r["problem_id"]),
                    str(t["model"]),
                    state,
                    int(t["prompt_tokens"]),
                    outputs[k],
                    sum(outputs[k:]),
                )
            )
    return out


class LoopForest:
    """One forest over every model's loops (a column per model): a loop dataset is small, and pooling lets
    each model's few loops borrow the shape of the others'. Picklable; served with one thread."""

    def __init__(self, n_estimators: int = 200, min_samples_leaf: int = 3, seed: int = 0) -> None:
        self.n_estimators = n_estimators
        self.min_samples_leaf = min_samples_leaf
        self.seed = seed
        self._models: tuple[str, ...] = ()
        self._forest: RandomForestQuantileRegressor | None = None

    @property
    def models(self) -> tuple[str, ...]:
        return self._models

    def matrix(self, states: Sequence[LoopState], models: Sequence[str]) -> npt.NDArray[np.float64]:
        rows = [
            [s.turn, s.attained_tokens, float(s.last_tool_failed), s.last_tool_chars, s.last_output_tokens]
            + [float(m == known) for known in self._models]
            for s, m in zip(states, models, strict=True)
        ]
        return np.asarray(rows, dtype=np.float64).reshape(len(rows), len(FEATURES) + len(self._models))

    def fit(self, moments: Sequence[LoopMoment]) -> LoopForest:
        if not moments:
            raise ValueError("no loop moments to learn from")
        self._models = tuple(sorted({m.model for m in moments}))
        forest = RandomForestQuantileRegressor(
            n_estimators=self.n_estimators, min_samples_leaf=self.min_samples_leaf, random_state=self.seed
        )
        x = self.matrix([m.state for m in moments], [m.model for m in moments])
        forest.fit(x, np.asarray([m.remaining for m in moments], dtype=np.float64))
        forest.set_params(n_jobs=1)
        self._forest = forest
        return self

    def predict(
        self, states: Sequence[LoopState], models: Sequence[str], quantiles: Sequence[float]
    ) -> npt.NDArray[np.float64]:
        """Array [len(states), len(quantiles)], non-decreasing in the quantile, never below 0."""
        if self._forest is None:
            raise RuntimeError("the loop forest is not fitted")
        qs = [float(q) for q in quantiles]
        if not states:
            return np.empty((0, len(qs)), dtype=np.float64)
        pred = np.asarray(self._forest.predict(self.matrix(states, models), quantiles=qs), dtype=np.float64)
        out = pred.reshape(len(states), len(qs))
        order = np.argsort(qs, kind="stable")
        out[:, order] = np.maximum.accumulate(out[:, order], axis=1)
        result: npt.NDArray[np.float64] = np.maximum(out, 0.0)
        return result
