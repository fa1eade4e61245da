"""The paper's router architecture: ``ModernBertForSequenceClassification``, multi-label (paper §2.1).

One sigmoid per model over the pooled encoder output, trained with binary cross-entropy. No package ships
ModernBERT weights (offline-assets.md §2), so by default the encoder is built from a small config with random
weights and a WordPiece tokenizer trained on the training tasks, and the whole network is trained here. An
operator who has ModernBERT-large on disk sets ``CHIMERA_ROUTER_MODERNBERT_PRETRAINED_PATH`` and the same
code fine-tunes it (the paper: 5 epochs, learning rate 1e-5, batch 16).

NOTE(labels): tasks are the distinct (text, workflow) pairs; a task's label for a model is its success rate
over that model's runs of it (usually one run, so 0 or 1), and the loss is masked where a model has no run
of the task, so traces covering the models unevenly train the heads they cover and no other.

NOTE(pickling): the artifact stores the config, the weights and the tokenizer's JSON, and rebuilds the
network on load: pickling a live ``nn.Module`` would tie the artifact to this transformers version's classes.
"""

from __future__ import annotations

import math
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
from services.router.heads import SUCCESS_THRESHOLD, router_input

SPECIAL = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]"}
MASK_TOKEN = "[MASK]"


class ModernBertSettings(CommonSettings):
    model_config = SettingsConfigDict(env_prefix="CHIMERA_ROUTER_MODERNBERT_", extra="ignore", frozen=True)

    pretrained_path: str = Field(default="", description="local ModernBERT checkpoint; empty: small config")
    vocab_size: int = Field(default=8192, ge=128, le=65536, description="tokenizer trained from scratch")
    hidden_size: int = Field(default=128, ge=16, le=4096, description="small config only")
    layers: int = Field(default=2, ge=1, le=48, description="small config only")
    heads: int = Field(default=2, ge=1, le=64, description="small config only; divides hidden_size")
    intermediate_size: int = Field(default=256, ge=16, le=16384, description="small config only")
    max_length: int = Field(default=128, ge=8, le=8192, description="tokens of task text read")
    batch_size: int = Field(default=32, ge=1, le=1024, description="tasks per optimizer step")
    epochs: float = Field(default=5.0, gt=0, le=100, description="passes over the tasks (paper: 5)")
    max_steps: int = Field(default=300, ge=1, description="cap on optimizer steps (CPU time)")
    learning_rate: float = Field(
        default=0.0, ge=0, le=1.0, description="0 means 1e-5 for a pretrained encoder, 5e-4 from scratch"
    )
    seed: int = Field(default=0, description="weight init and batch order")


class ModernBertRouter:
    name = "modernbert"

    def __init__(self, settings: ModernBertSettings | None = None) -> None:
        self.settings = settings or ModernBertSettings()
        self._models: tuple[str, ...] = ()
        self._net: Any = None
        self._tokenizer: Any = None

    @property
    def models(self) -> tuple[str, ...]:
        return self._models

    def _train_tokenizer(self, texts: Sequence[str]) -> Any:
        from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors, trainers
        from tokenizers.models import WordPiece
        from transformers import PreTrainedTokenizerFast

        tok = Tokenizer(WordPiece(unk_token=SPECIAL["unk_token"]))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        specials = [*SPECIAL.values(), MASK_TOKEN]
        tok.train_from_iterator(
            texts, trainers.WordPieceTrainer(vocab_size=self.settings.vocab_size, special_tokens=specials)
        )
        cls, sep = SPECIAL["cls_token"], SPECIAL["sep_token"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}",
            special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))],
        )
        return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
            tokenizer_object=tok, mask_token=MASK_TOKEN, **SPECIAL
        )

    def _build(self, texts: Sequence[str], n_labels: int) -> None:
        from transformers import AutoTokenizer, ModernBertConfig, ModernBertForSequenceClassification

        s = self.settings
        if s.pretrained_path:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            self._tokenizer = AutoTokenizer.from_pretrained(s.pretrained_path)
            self._net = ModernBertForSequenceClassification.from_pretrained(
                s.pretrained_path, num_labels=n_labels, problem_type="multi_label_classification"
            )
            return
        self._tokenizer = self._train_tokenizer(texts)
        t = self._tokenizer
        config = ModernBertConfig(
            vocab_size=len(t),
            hidden_size=s.hidden_size,
            num_hidden_layers=s.layers,
            num_attention_heads=s.heads,
            intermediate_size=s.intermediate_size,
            max_position_embeddings=max(512, s.max_length),
            pad_token_id=t.pad_token_id,
            cls_token_id=t.cls_token_id,
            sep_token_id=t.sep_token_id,
            bos_token_id=t.cls_token_id,
            eos_token_id=t.sep_token_id,
            problem_type="multi_label_classification",
        )
        config.num_labels = n_labels
        self._net = ModernBertForSequenceClassification(config)

    def _encode(self, texts: Sequence[str]) -> dict[str, Any]:
        batch = dict(
            self._tokenizer(
                list(texts),
                padding=True,
                truncation=True,
                max_length=self.settings.max_length,
                return_tensors="pt",
            )
        )
        batch.pop("token_type_ids", None)  # ModernBERT takes none; BERT-style tokenizers emit them
        return batch

    def fit(self, traces: Sequence[TraceRow], outcomes: Sequence[OutcomeRow]) -> None:
        import torch

        examples = router_examples(traces, outcomes)
        if not examples:
            raise ValueError("no outcome could be joined with a trace: nothing to learn from")
        s = self.settings
        torch.manual_seed(s.seed)
        self._models = tuple(sorted({e.model for e in examples}))
        keys = sorted({(e.text, e.workflow) for e in examples})
        row = {k: i for i, k in enumerate(keys)}
        col = {m: j for j, m in enumerate(self._models)}
        hits = np.zeros((len(keys), len(self._models)))
        runs = np.zeros_like(hits)
        for e in examples:
            i, j = row[(e.text, e.workflow)], col[e.model]
            hits[i, j] += float(e.outcome >= SUCCESS_THRESHOLD)
            runs[i, j] += 1
        labels = torch.tensor(np.divide(hits, np.maximum(runs, 1)), dtype=torch.float32)
        mask = torch.tensor(runs > 0, dtype=torch.float32)
        texts = [router_input(t, w) for t, w in keys]
        self._build(texts, len(self._models))
        lr = s.learning_rate or (1e-5 if s.pretrained_path else 5e-4)
        optimizer = torch.optim.AdamW(self._net.parameters(), lr=lr)
        loss_fn = torch.nn.BCEWithLogitsLoss(reduction="none")
        steps = min(s.max_steps, math.ceil(s.epochs * len(keys) / s.batch_size))
        order = np.random.default_rng(s.seed)
        perm = order.permutation(len(keys))
        at = 0
        self._net.train()
        for _ in range(steps):
            if at + s.batch_size > len(perm):
                perm, at = order.permutation(len(keys)), 0
            idx = perm[at : at + s.batch_size]
            at += s.batch_size
            logits = self._net(**self._encode([texts[i] for i in idx])).logits
            loss = (loss_fn(logits, labels[idx]) * mask[idx]).sum() / mask[idx].sum().clamp(min=1.0)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        self._net.eval()

    def predict_proba(self, texts: Sequence[str], workflows: Sequence[str]) -> npt.NDArray[np.float64]:
        import torch

        if len(texts) != len(workflows):
            raise ValueError("texts and workflows must have the same length")
        if self._net is None:
            raise RuntimeError("ModernBertRouter is not fitted")
        inputs = [router_input(t, w) for t, w in zip(texts, workflows, strict=True)]
        out = np.empty((len(inputs), len(self._models)), dtype=np.float64)
        step = self.settings.batch_size
        with torch.inference_mode():
            for i in range(0, len(inputs), step):
                logits = self._net(**self._encode(inputs[i : i + step])).logits
                out[i : i + step] = torch.sigmoid(logits).double().numpy()
        return out

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_net", "_tokenizer")}
        if self._net is not None:
            state["_config"] = self._net.config.to_dict()
            state["_weights"] = {k: v.detach().cpu() for k, v in self._net.state_dict().items()}
            state["_tokenizer_json"] = self._tokenizer.backend_tokenizer.to_str()
            state["_special"] = {k: getattr(self._tokenizer, k) for k in (*SPECIAL, "mask_token")}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        config = state.pop("_config", None)
        weights = state.pop("_weights", None)
        tokenizer_json = state.pop("_tokenizer_json", None)
        special = state.pop("_special", {})
        self.__dict__.update(state)
        self._net = self._tokenizer = None
        if config is None:
            return
        from tokenizers import Tokenizer
        from transformers import (
            ModernBertConfig,
            ModernBertForSequenceClassification,
            PreTrainedTokenizerFast,
        )

        self._tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
            tokenizer_object=Tokenizer.from_str(tokenizer_json), **{k: v for k, v in special.items() if v}
        )
        self._net = ModernBertForSequenceClassification(ModernBertConfig.from_dict(config))
        self._net.load_state_dict(weights)
        self._net.eval()
