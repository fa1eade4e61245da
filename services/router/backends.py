"""The router backend contract, the registry of backends, and the trace/outcome join they train on.

A backend maps a workflow's task text (and workflow type) to one independent success probability per model
(paper §2.1). The server only ever calls ``predict_proba`` and reads ``models``/``name``, so a new backend
(TF-IDF, MiniLM, ModernBERT) drops in by adding one line to ``BACKENDS``, or by naming its class as
``"package.module:Class"``, with no change to the server.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from services.common.types import OutcomeRow, TraceRow


@runtime_checkable
class RouterBackend(Protocol):
    """What the router server and the training function need from a backend. Must be picklable."""

    name: str

    @property
    def models(self) -> tuple[str, ...]:
        """Model names, in the column order of ``predict_proba``."""
        ...

    def fit(self, traces: Sequence[TraceRow], outcomes: Sequence[OutcomeRow]) -> None: ...

    def predict_proba(self, texts: Sequence[str], workflows: Sequence[str]) -> npt.NDArray[np.float64]:
        """Array of shape [len(texts), len(models)] with values in [0, 1]."""
        ...


# Lazy import paths, so that heavy backends (torch) load only when used.
BACKENDS: Mapping[str, str] = MappingProxyType(
    {
        "prior": "services.router.prior:PriorRouter",
        "tfidf": "services.router.tfidf:TfidfRouter",
        "minilm": "services.router.minilm:MiniLmRouter",
        "modernbert": "services.router.modernbert:ModernBertRouter",
    }
)

# Backends cheap enough to run inside the dispatcher (CHIMERA_DISPATCHER_INFERENCE=inline): numpy and
# scikit-learn on the CPU, well under a millisecond a call. The encoders (torch) stay in the router service,
# where a GPU, its memory and its batching belong.
INLINE_BACKENDS: frozenset[str] = frozenset({"prior", "tfidf"})


def make_backend(name: str) -> RouterBackend:
    """Build an unfitted backend from a registry name or a ``"module:Class"`` path."""
    path = BACKENDS.get(name, name)
    module_name, _, cls_name = path.partition(":")
    if not cls_name:
        raise ValueError(f"unknown router backend {name!r}; known: {sorted(BACKENDS)} or 'module:Class'")
    backend = getattr(importlib.import_module(module_name), cls_name)()
    if not isinstance(backend, RouterBackend):
        raise TypeError(f"{path} does not implement RouterBackend")
    return backend


@dataclass(frozen=True, slots=True)
class RouterExample:
    """One (task, model) pair with its outcome: the unit the router learns from."""

    program_id: str
    text: str  # the task text: the first stage's first user message
    workflow: str
    model: str
    outcome: float  # task score in [0, 1]; >= 0.5 counts as a success for ranking metrics


def router_examples(traces: Sequence[TraceRow], outcomes: Sequence[OutcomeRow]) -> list[RouterExample]:
    """Join outcomes with their program's first-stage trace; outcomes without any trace are dropped."""
    first: dict[str, TraceRow] = {}
    for t in traces:
        prev = first.get(t.program_id)
        if prev is None or t.stage < prev.stage:
            first[t.program_id] = t
    out: list[RouterExample] = []
    for o in outcomes:
        ft = first.get(o.program_id)
        if ft is None:
            continue
        t = ft
        out.append(
            RouterExample(
                program_id=o.program_id,
                text=t.user_text,
                workflow=o.workflow or t.workflow,
                model=o.model or t.model,
                outcome=min(1.0, max(0.0, float(o.outcome))),
            )
        )
    return out
