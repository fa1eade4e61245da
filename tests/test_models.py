"""Offline model builders: the random Llamas (tiny and the deliberately larger small) and SmolLM2 from its
PyPI wheel. Marked ``vllm`` because they need the heavy torch/transformers stack the engines use."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from vllm_fixtures import tiny_model  # noqa: F401  (session fixture)

from services.worker.models import build_tiny_llama, model_cache, smollm2_dir

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(120)]


def _params(cfg: dict[str, int]) -> int:
    h, i, n, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    return n * (4 * h * h + 3 * h * i) + v * h


def test_tiny_model_has_a_chat_template_and_matching_vocab(tiny_model: Path) -> None:  # noqa: F811
    from transformers import AutoTokenizer

    cfg = json.loads((tiny_model / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(tiny_model)
    assert cfg["vocab_size"] == len(tok)
    assert cfg["eos_token_id"] == tok.convert_tokens_to_ids("<|im_end|>")
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert (tiny_model / "model.safetensors").stat().st_size < 10_000_000


def test_small_model_is_genuinely_larger(tiny_model: Path, tmp_path: Path) -> None:  # noqa: F811
    small = build_tiny_llama(tmp_path / "small", "small", tokenizer_from=tiny_model)
    c_tiny = json.loads((tiny_model / "config.json").read_text())
    c_small = json.loads((small / "config.json").read_text())
    assert c_small["vocab_size"] == c_tiny["vocab_size"]  # the shared tokenizer
    assert c_small["num_hidden_layers"] == 4 * c_tiny["num_hidden_layers"]
    assert c_small["hidden_size"] == 2 * c_tiny["hidden_size"]
    # Transformer-block parameters (decode FLOPs per token) grow about 16x.
    assert _params(c_small) > 4 * _params(c_tiny)


def test_random_weights_are_reproducible(tmp_path: Path, tiny_model: Path) -> None:  # noqa: F811
    a = build_tiny_llama(tmp_path / "a", "tiny", tokenizer_from=tiny_model, seed=1)
    b = build_tiny_llama(tmp_path / "b", "tiny", tokenizer_from=tiny_model, seed=1)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_model_cache_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CHIMERA_MODEL_CACHE", str(tmp_path))
    assert model_cache() == tmp_path
    monkeypatch.delenv("CHIMERA_MODEL_CACHE")
    assert model_cache() == Path.home() / ".cache" / "chimera" / "models"
    assert model_cache(tmp_path / "x") == tmp_path / "x"


def test_smollm2_converts_once_and_is_reused() -> None:
    """Uses the shared cache (outside the repository): the first run on a machine downloads the wheel with
    pip and converts it (~20 s); later runs only check that it is there."""
    path = smollm2_dir()
    t0 = time.monotonic()
    assert smollm2_dir() == path
    assert time.monotonic() - t0 < 1.0
    cfg = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in cfg
    assert cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 30
    assert (path / "model.safetensors").stat().st_size > 200_000_000


def test_resolve_model_names_and_paths(tmp_path: Path, tiny_model: Path) -> None:  # noqa: F811
    from services.worker.models import resolve_model

    built = resolve_model("tiny", cache=tmp_path)
    assert built == tmp_path / "random-llama-tiny" and (built / "model.safetensors").exists()
    assert resolve_model("tiny", cache=tmp_path) == built  # idempotent: built once
    assert resolve_model(str(tiny_model)) == tiny_model
    with pytest.raises(FileNotFoundError):
        resolve_model(str(tmp_path / "nothing-here"))
