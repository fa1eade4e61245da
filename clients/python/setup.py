"""Builds chimera-client from the repository it sits in.

``chimera_client`` is taken from the top of the tree, where the server imports it too, so there is one
copy of the code. The dispatcher's stubs are generated from ``protos/`` at build time, as ``make proto``
does for the server (they are never committed); the wheel ships them under the same ``chimera`` package
name so that a process holding both the server and the client registers each message once.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROTO = Path("chimera/dispatcher/v1/dispatcher.proto")


class BuildPyWithStubs(build_py):
    def run(self) -> None:
        # Builds happen in place (clients/python/build): start empty, or a module since deleted from
        # chimera_client would still be packed from an earlier build.
        shutil.rmtree(self.build_lib, ignore_errors=True)
        super().run()
        from grpc_tools import protoc  # a build requirement (pyproject.toml)

        out = Path(self.build_lib)
        protos = REPO / "protos"
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{protos}",
                f"--python_out={out}",
                f"--grpc_python_out={out}",
                f"--pyi_out={out}",
                str(protos / PROTO),
            ]
        )
        if rc != 0:
            raise RuntimeError(f"protoc failed on {PROTO} ({rc})")
        for package in PROTO.parents:
            if package != Path("."):
                (out / package / "__init__.py").touch()


setup(
    packages=["chimera_client"],
    # setuptools wants a relative path; the package lives two folders up, beside services/.
    package_dir={"chimera_client": os.path.relpath(REPO / "chimera_client", HERE)},
    package_data={"chimera_client": ["py.typed"]},
    cmdclass={"build_py": BuildPyWithStubs},
)
