"""Run untrusted Python in a child interpreter with limits: the execution half of the verifiers.

One run gets a fresh temporary directory as its working directory (deleted afterwards), a clean
environment (no inherited variables, so no credentials or proxies), a wall-clock timeout enforced by the
parent (the child's whole process group is killed), CPU-time, address-space, file-size, core and process
limits set with ``resource.setrlimit`` inside the child (``sandbox_boot.py``), Python-level guards that
refuse sockets and new processes, and its stdout and stderr written to files (so an endless print loop
fills at most ``file_mb``, never the parent's memory) and truncated when read back.

NOTE(sandbox): this is a guard against *accidents* (a wrong answer that loops, allocates without end,
prints forever, or calls a URL from a docstring example), not a security boundary: code that wants out can
import ``_socket`` or ``ctypes``, read the files the user can read, or use the network through a C
extension. On Linux without root there is no ``unshare``/network namespace to use instead. A deployment
that runs code from untrusted users must run the verifier inside a real isolation layer: a container with
no network and a read-only root, gVisor (runsc), nsjail or Firecracker, with this module's limits kept as
the inner layer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from services.verify.config import VerifySettings

BOOT = Path(__file__).with_name("sandbox_boot.py")
Status = Literal["ok", "error", "timeout", "cpu", "memory", "output"]
# Libraries that start a thread pool per core would trip RLIMIT_NPROC and inflate the address space.
_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONIOENCODING": "utf-8",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


@dataclass(frozen=True, slots=True)
class Limits:
    timeout_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 1024
    file_mb: int = 16
    nproc: int = 1  # only the process itself (where RLIMIT_NPROC applies at all: not for root)
    max_output_chars: int = 4000

    @classmethod
    def from_settings(cls, settings: VerifySettings) -> Limits:
        return cls(
            timeout_s=settings.timeout_s,
            cpu_s=settings.cpu_s,
            memory_mb=settings.memory_mb,
            file_mb=settings.file_mb,
            max_output_chars=settings.max_output_chars,
        )


@dataclass(frozen=True, slots=True)
class RunResult:
    status: Status
    returncode: int | None  # None when the parent killed it at the timeout
    stdout: str
    stderr: str
    wall_s: float
    truncated: bool  # stdout or stderr was longer than Limits.max_output_chars

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _read_capped(path: Path, limit: int) -> tuple[str, bool]:
    with path.open("rb") as f:
        data = f.read(4 * limit + 4)  # UTF-8: at most 4 bytes a character
    text = data.decode("utf-8", errors="replace")
    if len(text) > limit:
        return text[:limit] + "\n…[truncated]", True
    return text, False


def _status(returncode: int | None, stderr: str, timed_out: bool) -> Status:
    if timed_out:
        return "timeout"
    if returncode == 0:
        return "ok"
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "cpu"  # nothing else kills the child: the CPU limit's soft then hard signal
    # CPython ignores SIGXFSZ, so a write past RLIMIT_FSIZE surfaces as OSError EFBIG instead.
    if returncode == -signal.SIGXFSZ or "File too large" in stderr:
        return "output"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return "memory"
    return "error"


def run_python(program: str, limits: Limits = Limits(), files: Mapping[str, str] | None = None) -> RunResult:
    """Run ``program`` as ``__main__`` in a sandboxed child interpreter and report how it ended.

    Args:
        program: Python source.
        limits: the run's limits (``Limits.from_settings(VerifySettings())`` for the configured ones).
        files: more files to write beside the program (relative name -> text), e.g. modules it imports.
    """
    with tempfile.TemporaryDirectory(prefix="chimera-verify-") as tmp:
        work = Path(tmp)
        main = work / "main.py"
        main.write_text(program, encoding="utf-8")
        for name, text in (files or {}).items():
            target = (work / name).resolve()
            if work.resolve() not in target.parents:
                raise ValueError(f"file {name!r} would be written outside the sandbox folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        rlimits = {
            "cpu_s": limits.cpu_s,
            "memory_mb": limits.memory_mb,
            "file_mb": limits.file_mb,
            "nproc": limits.nproc,
        }
        env = {**_ENV, "HOME": tmp, "TMPDIR": tmp}
        out_path, err_path = work / ".stdout", work / ".stderr"
        t0 = time.monotonic()
        timed_out = False
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", str(BOOT), json.dumps(rlimits), str(main)],
                cwd=tmp,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # its own process group: the timeout kills whatever it started
                close_fds=True,
            )
            try:
                returncode: int | None = proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                returncode = None
                _kill_group(proc)
        wall = time.monotonic() - t0
        stdout, cut_out = _read_capped(out_path, limits.max_output_chars)
        stderr, cut_err = _read_capped(err_path, limits.max_output_chars)
    return RunResult(
        status=_status(returncode, stderr, timed_out),
        returncode=returncode,
        stdout=stdout,
        stderr=stderr,
        wall_s=round(wall, 3),
        truncated=cut_out or cut_err,
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
