"""The first code the sandboxed interpreter runs: limits and guards, then the program under test.

Started by ``sandbox.py`` as ``python -I sandbox_boot.py LIMITS_JSON PROGRAM``. The limits are applied here,
inside the child and after the interpreter has started (so its own start-up is not counted against them),
rather than through ``preexec_fn``, which is unsafe in a parent that runs threads (the demo's event loop
hands verification to a thread). Kept free of project imports on purpose: it runs in a clean interpreter.

NOTE(sandbox): the network and process guards below replace Python-level entry points. Code that imports
``_socket`` or calls ``ctypes`` gets around them: they stop a model's answer from reaching the network or
forking by *accident*, they are not a boundary against hostile code (see ``sandbox.py``).
"""

from __future__ import annotations

import json
import os
import resource
import runpy
import socket
import subprocess
import sys
from typing import Any, NoReturn

MIB = 1 << 20


def _refuse(*_args: Any, **_kwargs: Any) -> NoReturn:
    raise PermissionError("network access is disabled in the Chimera verifier sandbox")


def _refuse_process(*_args: Any, **_kwargs: Any) -> NoReturn:
    raise PermissionError("starting processes is disabled in the Chimera verifier sandbox")


class _NoSocket(socket.socket):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _refuse()


def _set_limit(which: int, soft: int, hard: int | None = None) -> None:
    _, current_hard = resource.getrlimit(which)
    hard = soft if hard is None else hard
    # An unprivileged process may lower a limit but never raise it past the hard one it was given.
    if current_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, current_hard), min(hard, current_hard)
    resource.setrlimit(which, (soft, hard))


def apply_limits(limits: dict[str, int]) -> None:
    # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL a second later (the hard one).
    _set_limit(resource.RLIMIT_CPU, limits["cpu_s"], limits["cpu_s"] + 1)
    _set_limit(resource.RLIMIT_AS, limits["memory_mb"] * MIB)
    _set_limit(resource.RLIMIT_FSIZE, limits["file_mb"] * MIB)
    _set_limit(resource.RLIMIT_CORE, 0)
    # Counted per user, and not enforced for root: the in-process guard below is what holds there.
    _set_limit(resource.RLIMIT_NPROC, limits["nproc"])


def install_guards() -> None:
    socket.socket = _NoSocket  # type: ignore[misc]
    socket.SocketType = _NoSocket
    for name in ("create_connection", "create_server", "getaddrinfo", "socketpair", "fromfd"):
        setattr(socket, name, _refuse)
    for name in ("fork", "forkpty", "system", "popen", "execv", "execve", "execvp", "posix_spawn"):
        if hasattr(os, name):
            setattr(os, name, _refuse_process)
    subprocess.Popen = _refuse_process  # type: ignore[assignment, misc]


def main(argv: list[str]) -> int:
    limits, program = json.loads(argv[1]), argv[2]
    # The program's own folder first, so a harness finds the modules written beside it.
    sys.path.insert(0, os.path.dirname(os.path.abspath(program)))
    apply_limits(limits)
    install_guards()
    runpy.run_path(program, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
