"""The structure of the package as rules that fail when broken (docs/explanation/architecture.md).

Every import counts, wherever it is written: at the top of a module, inside a function (a lazy
import), and under `if TYPE_CHECKING:` (a type-only import), since each is a dependency a
reader follows. The floors are read from the architecture page's table, so the page and this
test cannot drift apart.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "src" / "attnkit"
TESTS = ROOT / "tests"
ARCHITECTURE = ROOT / "docs" / "explanation" / "architecture.md"
LONG = 400  # lines; a longer module names why in its first line ("over 400 lines: ...")
# What may import the command line: its own modules, and `python -m attnkit`.
CLI_USERS = ("attnkit.cli", "attnkit.__main__")


@cache
def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imported(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """The modules of `known` that the file at `path` (module `name`) imports, anywhere in it:
    `from a.b import c` imports the module a.b.c when there is one, else a.b."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


@cache
def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(path, name, known) for name, path in known.items()}


def floors() -> list[tuple[str, set[str]]]:
    """The architecture page's floors, bottom up: (floor, the top-level names it holds)."""
    rows = []
    for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1].startswith("`"):
            names = {n.removesuffix(".py").rstrip("/") for n in re.findall(r"`([^`]+)`", cells[1])}
            rows.append((cells[0], names))
    return rows


def floor_of(module: str, table: list[tuple[str, set[str]]]) -> int | None:
    """The index of the floor whose row names `module`'s top-level module or package."""
    top = module.split(".")[1] if "." in module else "attnkit"
    return next((i for i, (_, names) in enumerate(table) if top in names), None)


def test_the_architecture_page_places_every_top_level_module_once() -> None:
    table = floors()
    assert len(table) >= 10, "the floors table of docs/explanation/architecture.md is not found"
    named = [name for _, names in table for name in names]
    assert len(named) == len(set(named)), "a module is named on two floors"
    tops = {m.split(".")[1] if "." in m else "attnkit" for m in modules()}
    assert tops - set(named) == set(), "modules no floor of the architecture page names"
    assert set(named) - tops == set(), "the architecture page names modules that do not exist"


def test_no_module_imports_from_a_floor_above_its_own() -> None:
    table = floors()
    upward = [
        f"{source} ({table[floor_of(source, table)][0]}) imports {target} "
        f"({table[floor_of(target, table)][0]})"
        for source, targets in graph().items()
        for target in targets
        if floor_of(target, table) > floor_of(source, table)
    ]
    assert upward == []


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_circles_are_found_through_type_only_and_lazy_imports() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from attnkit import b\n"
    lazy = "def f():\n    from attnkit.b import thing\n"
    for text in (source, lazy):
        path = Path(__file__).parent / "structure-probe.py"
        try:
            path.write_text(text)
            known = {"attnkit.a": path, "attnkit.b": path}
            assert imported(path, "attnkit.a", known) == {"attnkit.b"}
        finally:
            path.unlink()


def test_no_import_circle_between_modules() -> None:
    assert circles(graph()) == []


def test_nothing_imports_the_command_line() -> None:
    users = [
        source
        for source, targets in graph().items()
        if any(t.startswith("attnkit.cli") for t in targets) and not source.startswith(CLI_USERS)
    ]
    assert users == []


def test_no_test_imports_another_test_module() -> None:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                last = name.split(".")[-1]
                if name.startswith("tests.") and (last.startswith("test_") or last == "conftest"):
                    found.append(f"{path.relative_to(ROOT)} imports {name}")
    assert found == []


def test_a_module_over_400_lines_names_why_in_its_first_line() -> None:
    long = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        if len(lines) > LONG and f"over {LONG} lines" not in lines[0]:
            long[str(path.relative_to(ROOT))] = len(lines)
    # Each: look for a second concept, or say in its first line why it is one ("over 400 lines:").
    assert long == {}


def test_every_benchmark_module_imports() -> None:
    """A module that moves breaks no benchmark unseen: `bench/` is run by hand, not by the suite,
    so its imports are tried here."""
    import bench

    for module in pkgutil.walk_packages(bench.__path__, "bench."):
        importlib.import_module(module.name)
