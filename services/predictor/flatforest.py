"""A fitted quantile forest flattened into arrays, for serving: same predictions, a fraction of the time.

NOTE(speed): ``RandomForestQuantileRegressor.predict`` walks its trees one at a time (``apply`` dispatches
every tree through joblib, even with ``n_jobs=1``) and then gathers leaf values tree by tree: 5-10 ms for a
single row with 100 trees, most of it per-tree Python overhead. The predictor's budget is 5 ms per call
*including* gRPC and the batch collector. Here every node of every tree lives in one set of arrays, and all
trees (and rows) descend together, one numpy step per tree level.

Exactness: with quantile-forest's default ``max_samples_leaf=1`` each leaf keeps one training target, and a
quantile is ``np.quantile`` (linear interpolation) over the row's leaf values across trees, which is what
``predict`` computes. Features are rounded to float32 before comparing with the thresholds, as sklearn's
trees do, so every row reaches the same leaves. ``test_qrf.py`` checks equality against ``predict``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]


@dataclass(frozen=True, slots=True)
class FlatForest:
    feature: IntArray  # split feature per node (0 at leaves, never read there)
    threshold: F64
    left: IntArray  # global node ids; a leaf points at itself, so extra descent steps are no-ops
    right: IntArray
    value: F64  # the training target a leaf keeps (meaningless at inner nodes)
    roots: IntArray
    depth: int

    @staticmethod
    def from_quantile_forest(forest: Any) -> FlatForest:
        """Flatten a fitted ``RandomForestQuantileRegressor`` (single output, ``max_samples_leaf=1``)."""
        if forest.max_samples_leaf != 1 or forest.monotonic_cst is not None:
            raise ValueError("only max_samples_leaf=1 without monotonic constraints can be flattened")
        y_train = np.asarray(forest.forest_.y_train, dtype=np.float64).T  # (n_train, n_outputs)
        if y_train.shape[1] != 1:
            raise ValueError("only single-output forests can be flattened")
        leaves = np.asarray(forest.forest_.y_train_leaves)  # (trees, nodes, outputs, 1): 1-based, 0 = none
        parts: dict[str, list[npt.NDArray[Any]]] = {k: [] for k in ("f", "t", "l", "r", "v")}
        roots, offset, depth = [], 0, 0
        for i, est in enumerate(forest.estimators_):
            tree = est.tree_
            n = tree.node_count
            is_leaf = tree.children_left < 0
            ids = np.arange(n, dtype=np.intp) + offset
            parts["f"].append(np.where(is_leaf, 0, tree.feature).astype(np.intp))
            parts["t"].append(np.where(is_leaf, 0.0, tree.threshold).astype(np.float64))
            parts["l"].append(np.where(is_leaf, ids, tree.children_left + offset).astype(np.intp))
            parts["r"].append(np.where(is_leaf, ids, tree.children_right + offset).astype(np.intp))
            index = leaves[i, :n, 0, 0].astype(np.intp)
            parts["v"].append(np.where(index > 0, y_train[np.maximum(index, 1) - 1, 0], np.nan))
            roots.append(offset)
            offset += n
            depth = max(depth, int(tree.max_depth))
        return FlatForest(
            feature=np.concatenate(parts["f"]),
            threshold=np.concatenate(parts["t"]),
            left=np.concatenate(parts["l"]),
            right=np.concatenate(parts["r"]),
            value=np.concatenate(parts["v"]),
            roots=np.asarray(roots, dtype=np.intp),
            depth=depth,
        )

    def leaf_values(self, x: F64) -> F64:
        """Shape [rows, trees]: the training target each tree's leaf holds for each row."""
        xs = np.asarray(x, dtype=np.float32).astype(np.float64)
        node = np.broadcast_to(self.roots, (len(xs), len(self.roots))).copy()
        rows = np.arange(len(xs))[:, None]
        for _ in range(self.depth):
            go_left = xs[rows, self.feature[node]] <= self.threshold[node]
            node = np.where(go_left, self.left[node], self.right[node])
        out: F64 = self.value[node]
        return out

    def predict(self, x: F64, quantiles: Sequence[float]) -> F64:
        """Shape [rows, len(quantiles)]."""
        if not len(x):
            return np.empty((0, len(quantiles)), dtype=np.float64)
        return linear_quantiles(self.leaf_values(x), quantiles)


def linear_quantiles(values: F64, quantiles: Sequence[float]) -> F64:
    """``np.quantile(values, quantiles, axis=1, method="linear").T``, bit for bit, for finite values.

    The same index, weight and interpolation arithmetic as numpy's, written out for the one case served
    here: numpy's general path (axis moves, partition bookkeeping, NaN checks) cost more than the forest
    descent on a one-row prediction.
    """
    n = values.shape[1]
    ordered = np.sort(values, axis=1)
    virtual = (n - 1) * np.asarray(quantiles, dtype=np.float64)
    previous = np.floor(virtual)
    following = previous + 1
    above = virtual >= n - 1  # numpy takes the last value there
    previous[above], following[above] = -1, -1
    below = virtual < 0
    previous[below], following[below] = 0, 0
    gamma = virtual - previous
    a = ordered[:, previous.astype(np.intp)]
    b = ordered[:, following.astype(np.intp)]
    diff = b - a
    out: F64 = a + diff * gamma
    np.subtract(b, diff * (1 - gamma), out=out, where=np.broadcast_to(gamma >= 0.5, out.shape))
    return out
