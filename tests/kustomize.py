"""A small offline renderer for the kustomize features deploy/kubernetes/ uses, so that ``make test`` renders
and checks the manifests on a machine without kubectl.

It implements exactly: ``resources`` (files, and directories holding a kustomization), ``namespace``,
``images`` (newName, newTag, digest) and ``secretGenerator`` from ``envs`` files with
``generatorOptions.disableNameSuffixHash: true``. Any other field of a kustomization is refused rather than
ignored, so a manifest cannot come to depend on a feature these tests would silently skip.
tests/test_kubernetes.py compares its output with ``kubectl kustomize`` where kubectl is installed.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

Doc = dict[str, Any]

SUPPORTED = {"apiVersion", "kind", "namespace", "resources", "images", "secretGenerator", "generatorOptions"}
# Kinds kustomize gives no namespace to; only these cluster-scoped kinds are expected here.
CLUSTER_SCOPED = {"Namespace"}
# Where a pod template sits in each workload kind the manifests use.
POD_SPEC_PATHS = {
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
}


class Unsupported(ValueError):
    """The kustomization uses something this renderer does not implement."""


def render(directory: Path) -> list[Doc]:
    """The objects ``kubectl kustomize DIRECTORY`` prints, in no particular order."""
    path = directory / "kustomization.yaml"
    k: dict[str, Any] = yaml.safe_load(path.read_text())
    if unknown := set(k) - SUPPORTED:
        raise Unsupported(f"{path}: {sorted(unknown)} not implemented by tests/kustomize.py")
    if k.get("kind", "Kustomization") != "Kustomization":
        raise Unsupported(f"{path}: kind {k['kind']}")
    docs: list[Doc] = []
    for entry in k.get("resources") or []:
        target = (directory / entry).resolve()
        if target.is_dir():
            docs += render(target)
        else:
            docs += [d for d in yaml.safe_load_all(target.read_text()) if d]
    docs += [_secret(directory, g, k.get("generatorOptions") or {}) for g in k.get("secretGenerator") or []]
    docs = copy.deepcopy(docs)  # transformers below write in place; no input object is shared
    if "namespace" in k:
        for d in docs:
            if d["kind"] not in CLUSTER_SCOPED:
                d["metadata"]["namespace"] = k["namespace"]
    for image in k.get("images") or []:
        _set_image(docs, image)
    return docs


def _secret(directory: Path, gen: dict[str, Any], options: dict[str, Any]) -> Doc:
    if unknown := set(gen) - {"name", "envs"}:
        raise Unsupported(f"secretGenerator {gen.get('name')}: {sorted(unknown)}")
    if set(options) != {"disableNameSuffixHash"} or options["disableNameSuffixHash"] is not True:
        # kustomize's name hash (and rewriting every reference to it) is not reproduced here.
        raise Unsupported("secretGenerator needs generatorOptions: {disableNameSuffixHash: true}")
    data: dict[str, str] = {}
    for env_file in gen["envs"]:
        for line in (directory / env_file).read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                key, sep, value = line.partition("=")
                if not sep:
                    raise Unsupported(f"{env_file}: {line!r} is not KEY=VALUE")
                data[key.strip()] = base64.b64encode(value.encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": gen["name"]},
        "type": "Opaque",
        "data": data,
    }


def pod_spec(doc: Doc) -> dict[str, Any] | None:
    """The pod template's spec of a workload, or None for other kinds."""
    node: Any = doc
    for key in POD_SPEC_PATHS.get(doc["kind"], ()):
        node = node[key]
    return node if doc["kind"] in POD_SPEC_PATHS else None


def split_image(ref: str) -> tuple[str, str, str]:
    """``name[:tag][@digest]`` -> (name, tag, digest); a registry's port is not taken for a tag."""
    rest, _, digest = ref.partition("@")
    name, _, tag = rest.rpartition(":") if ":" in rest.rsplit("/", 1)[-1] else (rest, "", "")
    return name, tag, digest


def _set_image(docs: list[Doc], image: dict[str, Any]) -> None:
    if unknown := set(image) - {"name", "newName", "newTag", "digest"}:
        raise Unsupported(f"images {image.get('name')}: {sorted(unknown)}")
    for d in docs:
        spec = pod_spec(d)
        for c in (spec or {}).get("containers", []) + (spec or {}).get("initContainers", []):
            name, tag, digest = split_image(c["image"])
            if name != image["name"]:
                continue
            name = image.get("newName", name)
            if "digest" in image:
                c["image"] = f"{name}@{image['digest']}"
            elif "newTag" in image:
                c["image"] = f"{name}:{image['newTag']}"
            else:
                c["image"] = name + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")
