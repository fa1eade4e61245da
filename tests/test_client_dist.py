"""The client distribution (clients/python) installs alone: built into a wheel, installed into an empty
venv with no index, it brings grpcio, protobuf and their own dependencies and nothing else, and imports.

Offline: grpcio's, protobuf's and their dependencies' wheels are packed again from this project's venv
(the files each one's RECORD lists), so the test needs no package index."""

from __future__ import annotations

import ast
import base64
import csv
import hashlib
import importlib.metadata as md
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = [pytest.mark.timeout(180)]
ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "chimera_client"
# The client's core may import only these (and the standard library); each integration its framework.
CORE_IMPORTS = {"chimera_client", "chimera", "grpc", "google"}
INTEGRATIONS = {
    "langchain": {"langchain_core"},
    "langgraph": {"httpx", "langchain_core", "langgraph"},
    "agents": {"agents", "openai"},
}


def _closure(names: set[str]) -> set[str]:
    """``names`` and everything they require (installed metadata, no extras), canonical names."""
    seen: set[str] = set()
    todo = [canonicalize_name(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for spec in md.requires(name) or ():
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(req.name))
    return seen


def _field(text: str, name: str) -> list[str]:
    """Every value of ``name`` in an email-header style metadata file (METADATA, WHEEL)."""
    return [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith(f"{name}: ")]


def _repack(name: str, out: Path) -> Path:
    """A wheel of the installed distribution ``name``, from the files its RECORD lists."""
    dist = md.distribution(name)
    info = f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}.dist-info"
    tag = next(
        line.split(": ", 1)[1]
        for line in (dist.read_text("WHEEL") or "").splitlines()
        if line.startswith("Tag: ")
    )
    path = out / f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}-{tag}.whl"
    rows = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as whl:
        for f in dist.files or ():
            skip = f.parts[0] == ".." or "__pycache__" in f.parts
            if skip or str(f) in {f"{info}/RECORD", f"{info}/INSTALLER", f"{info}/direct_url.json"}:
                continue
            data = Path(str(f.locate())).read_bytes()
            whl.writestr(str(f), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append((str(f), f"sha256={digest}", str(len(data))))
        record = io.StringIO()
        csv.writer(record).writerows([*rows, (f"{info}/RECORD", "", "")])
        whl.writestr(f"{info}/RECORD", record.getvalue())
    return path


def _build_client_wheel(out: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["-w", str(out), str(ROOT / "clients" / "python")],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("chimera_client-*.whl")
    return wheel


def test_the_client_installs_alone_into_an_empty_venv(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = _build_client_wheel(wheels)
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        assert "chimera/dispatcher/v1/dispatcher_pb2_grpc.py" in z.namelist()  # the stubs ship
        assert not [n for n in z.namelist() if n.startswith("services/")]
    runtime = {
        Requirement(line.split(": ", 1)[1])
        for line in meta.splitlines()
        if line.startswith("Requires-Dist: ")
    }
    needed = {canonicalize_name(r.name) for r in runtime if r.marker is None}
    assert needed == {"grpcio", "protobuf"}
    deps = _closure(needed)
    for name in deps:
        _repack(name, wheels)

    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    py = env / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-index"]
        + ["--find-links", str(wheels), "chimera-client"],
        check=True,
        capture_output=True,
    )

    probe = """
import importlib.metadata as md, json
import chimera_client, chimera.dispatcher.v1.dispatcher_pb2_grpc
from chimera_client import AsyncClient, Client, RetryPolicy, Workflow
missing = []
for name in ("chimera_client.langgraph", "chimera_client.agents"):
    try:
        __import__(name)
    except ImportError as e:
        missing.append(e.name)
Client("127.0.0.1:1", api_key="k").close()
print(json.dumps({"dists": sorted(d.metadata["Name"] for d in md.distributions()),
                  "file": chimera_client.__file__, "missing": missing}))
"""
    # -I: nothing from this checkout (the working directory, PYTHONPATH) may satisfy an import.
    done = subprocess.run(
        [str(py), "-I", "-c", probe], cwd=tmp_path, check=True, capture_output=True, text=True
    )
    got = json.loads(done.stdout)
    assert {canonicalize_name(n) for n in got["dists"]} == {"chimera-client", *deps}
    assert got["file"].startswith(str(env))
    assert got["missing"] == ["httpx", "agents"]  # the frameworks are extras, absent here


def test_the_server_and_tests_use_the_client_code() -> None:
    import chimera_client
    import services.sdk
    from services.sdk import retry

    assert services.sdk.AsyncClient is chimera_client.AsyncClient
    assert retry.RetryPolicy is chimera_client.RetryPolicy


def _top_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module.split(".")[0])
    return out - set(sys.stdlib_module_names) - {"__future__"}


def test_the_client_imports_only_grpc_protobuf_and_each_integration_its_framework() -> None:
    for path in CLIENT.glob("*.py"):
        allowed = CORE_IMPORTS | INTEGRATIONS.get(path.stem, set())
        assert _top_imports(path) <= allowed, path.name
