"""The layout stays a house (DESIGN §1): no import circle among the project's modules, and no package folder (tests'
folders included) of more than twelve modules.

Imports are read with ``ast`` from the source files, so every import counts, the ones inside functions (lazy, to keep
`traceana --help` cheap) included: a circle through a lazy import is still two modules that need each other. Only
imports under ``if TYPE_CHECKING:`` are left out, since they never run and name a type across a one-way dependency.
``from a import b`` is an edge to module ``a.b`` where that is a module, else to ``a``; importing a module does not
count as importing its parent package (Python runs the parent's ``__init__`` first, which is no dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

# Source folder -> the package it is installed as (pyproject's package-dir).
PACKAGES = {"traceana": "traceana", "ingest": "traceana.ingest", "estimator": "traceana.estimator",
            "queries": "traceana.queries", "synth": "traceana.synth"}
MAX_MODULES = 12


def modules() -> dict[str, Path]:
    """Every project module by its import name."""
    found = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


def _type_checking_only(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules that module ``name`` at ``path`` imports."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: ``level`` dots climb from the module's package
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {m for m in found if m in known and m != name}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (module -> modules it imports) as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := walk(start)):
            return found
    return None


def test_cycle_finder_finds_a_circle_and_no_false_one() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_imports_are_read_as_the_project_resolves_them() -> None:
    known = set(modules())
    cli_main = imports(ROOT / "traceana/cli/main.py", "traceana.cli.main", known)
    assert {"traceana.cli.ingest", "traceana.cli.analyses", "traceana.errors"} <= cli_main  # `from pkg import mod`
    dataset = imports(ROOT / "traceana/store/dataset.py", "traceana.store.dataset", known)
    assert "traceana.store.database" in dataset
    run_data = imports(ROOT / "ingest/run_data.py", "traceana.ingest.run_data", known)
    assert "traceana.ingest.parallel.spill" not in run_data  # a TYPE_CHECKING import only


def test_no_import_circle() -> None:
    found = modules()
    known = set(found)
    graph = {name: imports(path, name, known) for name, path in found.items()}
    assert len(graph) > 80  # every module was read
    assert cycle(graph) is None, " -> ".join(cycle(graph) or [])


def test_no_folder_holds_more_than_twelve_modules() -> None:
    crowded = {}
    for folder in (*PACKAGES, "tests"):
        for init in (ROOT / folder).rglob("__init__.py"):
            count = len([p for p in init.parent.glob("*.py") if p.name != "__init__.py"])
            if count > MAX_MODULES:
                crowded[str(init.parent.relative_to(ROOT))] = count
    assert crowded == {}


def test_every_package_says_what_it_does() -> None:
    """Each package's __init__.py opens with a docstring (what it does, which module to open first)."""
    silent = [str(init.relative_to(ROOT)) for folder in PACKAGES for init in (ROOT / folder).rglob("__init__.py")
              if not ast.get_docstring(ast.parse(init.read_text()))]
    assert silent == []


def test_the_readmes_paths_exist() -> None:
    """Every project path README.md and docs/ name in backticks (a file, a folder, a `file.py:function`) is there."""
    import re

    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))])
    named = {m.split(":")[0] for m in re.findall(r"`((?:ingest|traceana|queries|estimator|synth|tests|benchmarks|"
                                                  r"sample_traces|examples)/[\w./:-]*)`", text)}
    assert len(named) > 30
    assert sorted(p for p in named if not (ROOT / p.rstrip("/")).exists() and "*" not in p) == []
