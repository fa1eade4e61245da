"""The shape of the code: no import circles, the policy kernel below every reader, each policy documented.

Imports are read from the source (``ast``), every one of them: module level, inside functions and under
``TYPE_CHECKING``, since a circle hidden in any of them is still a circle a reader must untangle.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.policy.registry import POLICIES

pytestmark = pytest.mark.unit

ROOT = Path(__file__).parents[1]
PACKAGES = ("services", "bench")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> Iterator[str]:
    """Project modules ``path`` imports: ``from pkg import sub`` is an edge to ``pkg.sub`` when that is a
    module, else to ``pkg`` (a name its ``__init__`` defines); the project uses absolute imports only."""
    me = _module(path)
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != me:
                yield name


def _graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {_module(p) for p in files}
    return {_module(p): set(_imports(p, modules)) for p in files}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle_under_services_or_bench() -> None:
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()) or [])


def _families() -> dict[str, set[str]]:
    """``bench``'s families (its sub-packages) and the other families each one imports."""
    graph: dict[str, set[str]] = {}
    for module, deps in _graph().items():
        parts = module.split(".")
        if parts[0] == "bench" and len(parts) > 2:
            graph.setdefault(parts[1], set()).update(d.split(".")[1] for d in deps if d.startswith("bench."))
    return {family: deps - {family} for family, deps in graph.items()}


def test_no_circle_between_the_benchmark_families() -> None:
    """A family may build on another (the live runs on the simulator), never both ways round."""
    assert _cycle(_families()) is None, " -> ".join(_cycle(_families()) or [])


def test_the_shared_bench_helpers_import_no_family() -> None:
    assert _families()["common"] == set()


def test_bench_is_a_few_modules_over_one_package_per_family_each_with_its_readme() -> None:
    bench = ROOT / "bench"
    assert len(list(bench.glob("*.py"))) <= 10
    packages = [p.parent for p in bench.glob("*/__init__.py")]
    assert len(packages) >= 6
    missing = [p.name for p in packages if not (p / "README.md").is_file()]
    assert missing == [], f"bench families without a README: {missing}"


def test_the_circle_finder_finds_circles() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_readers_of_the_policy_do_not_reach_into_the_dispatcher() -> None:
    graph = _graph()
    offenders = sorted(
        (m, dep)
        for m, deps in graph.items()
        if m.startswith(("bench", "services.inspect", "services.policy"))
        for dep in deps
        if dep.startswith("services.dispatcher")
    )
    assert offenders == []


def test_the_policy_kernel_is_pure() -> None:
    """No Redis, gRPC, HTTP or clock inside a policy: the simulator must be able to run it as is."""
    banned = re.compile(r"^\s*(import|from)\s+(redis|grpc|fastapi|httpx|time|asyncio|chimera)\b", re.M)
    for path in (ROOT / "services" / "policy").glob("*.py"):
        assert not banned.search(path.read_text()), path.name


def test_every_registered_policy_has_its_section_in_the_policy_readme() -> None:
    readme = (ROOT / "services" / "policy" / "README.md").read_text()
    headings = set(re.findall(r"^## `([\w-]+)`", readme, re.M))
    assert set(POLICIES) <= headings, f"services/policy/README.md lacks: {sorted(set(POLICIES) - headings)}"
