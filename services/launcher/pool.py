"""The engine pool an operator serves: which engines exist, what model each runs and how.

A pool is a small YAML file (``chimera up --pool FILE``). The embedded pools are in ``pools/``:
``vllm-cpu`` (the default: two real vLLM instruct models of different size and strength, SmolLM2-135M and
Qwen2.5-Coder-0.5B), ``qwen-coder-3`` (the three-model benchmark pool) and ``simulated`` (profile-driven
simulated engines, a measuring instrument); ``--pool simulated`` names one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

POOLS = Path(__file__).with_name("pools")
DEFAULT_POOL = POOLS / "vllm-cpu.yaml"


class EngineSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="engine id; also its Redis hash tag")
    model: str = Field(min_length=1, description="model name the router scores and clients may pin")
    kind: Literal["simulated", "vllm", "remote"] = "simulated"
    max_num_seqs: int = Field(16, ge=1, le=4096)
    # Until live traces exist, the router and predictor are bootstrapped from the workload's outcome model
    # for this paper model (a real engine here, e.g. SmolLM2, has no published statistics of its own).
    stand_in: str | None = Field(None, description="paper model whose synthetic traces bootstrap this one")
    tool_parser: str = Field(
        "", description='vLLM tool parser of the model ("hermes" for Qwen2.5); "" serves no tool calls'
    )
    # Anything else the worker reads (CHIMERA_WORKER_<NAME>), e.g. model_path, url, time_scale.
    env: dict[str, str] = Field(default_factory=dict)

    @property
    def calls_tools(self) -> bool:
        """Whether its engine reads tool calls back (as its worker registers it, EngineField.TOOLS): a vLLM
        engine needs a tool parser; a simulated engine always calls, a remote one leaves it to its server."""
        return self.kind != "vllm" or bool(self.tool_parser)


class PoolSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    engines: tuple[EngineSpec, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_ids(self) -> PoolSpec:
        ids = [e.id for e in self.engines]
        if len(set(ids)) != len(ids):
            raise ValueError(f"engine ids must be unique, got {ids}")
        return self

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e.model for e in self.engines))

    @property
    def tool_models(self) -> tuple[str, ...]:
        """The models whose engines can run an agent's tool calls."""
        return tuple(dict.fromkeys(e.model for e in self.engines if e.calls_tools))


def resolve_pool(path: Path | None) -> Path:
    """A pool file path, or the name of an embedded pool (``simulated``, ``vllm-cpu``)."""
    if path is None:
        return DEFAULT_POOL
    if not path.exists() and (POOLS / f"{path}.yaml").exists():
        return POOLS / f"{path}.yaml"
    return path


def load_pool(path: Path | None = None) -> PoolSpec:
    raw = yaml.safe_load(resolve_pool(path).read_text())
    return PoolSpec.model_validate(raw)
