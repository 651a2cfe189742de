"""The house rules that no single feature's test would notice breaking: no import
circles between the service's modules (a circle hidden behind ``if TYPE_CHECKING:`` is
still one: the two modules can no longer be read, moved or tested apart)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("api", "tasks", "storage", "pipelines", "media", "core", "omnijobs")


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the service's packages."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Our modules that ``name`` imports anywhere in its text: at the top, inside a
    function, under ``if TYPE_CHECKING:``. ``from a import b`` is an edge to ``a.b``
    where that is a module, else to ``a``. The parent packages a dotted import runs
    first are not edges: a package's ``__init__`` gathering its own modules is no
    circle."""
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            rest = node.module.split(".") if node.module else []
            target = ".".join(base[:len(base) - node.level + 1] + rest if node.level
                              else rest)
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:
                    found.add(f"{target}.{alias.name}")
                elif target in modules:
                    found.add(target)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                dotted = alias.name
                while dotted and dotted not in modules:
                    dotted = dotted.rpartition(".")[0]
                if dotted:
                    found.add(dotted)
    return found - {name}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for step in graph.get(todo.pop(), ()):
            if step not in seen:
                seen.add(step)
                todo.append(step)
    return seen


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that reach each other by imports (each group once)."""
    reach = {name: _reach(graph, name) for name in graph}
    groups = {tuple(sorted(m for m in reach[name] if name in reach[m]))
              for name in graph if name in reach[name]}
    return sorted(list(group) for group in groups)


def test_the_circle_finder_counts_type_checking_and_function_imports(tmp_path):
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}) == [
        ["a", "b", "c"]]
    deps = tmp_path / "deps.py"
    deps.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "    from .live import Live\n"
                    "def later():\n    import api.submitter\n"
                    "from . import service, metrics\n")
    modules = dict.fromkeys(["api", "api.deps", "api.live", "api.submitter",
                             "api.service"], deps)
    assert _imports("api.deps", deps, modules) == {"api.live", "api.submitter",
                                                   "api.service", "api"}


def test_no_import_circles_in_the_service():
    graph = import_graph()
    assert {"api.deps", "api.live", "storage.repositories.jobs", "omnijobs.cli"} <= set(graph)
    found = circles(graph)
    assert not found, {" <-> ".join(group): {m: sorted(graph[m] & set(group)) for m in group}
                       for group in found}
