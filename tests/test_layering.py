"""The package's import structure (docs/design.md §1): imports point one way,
``service -> workers -> gnn -> planner`` with ``db`` beside the first two, and no import
cycle anywhere, not even through an import deferred into a function (a cycle makes import
order matter and breaks on refactors); imports under ``if TYPE_CHECKING:`` never run and
do not count. Read from the source with :mod:`ast`, so nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tagplan"

FORBIDDEN = {
    "planner": ("service", "workers", "db", "gnn", "cli"),
    "gnn": ("service", "workers", "db", "cli"),
    "db": ("service", "workers", "cli"),
    "workers": ("service", "cli"),
}
"""Layer -> the layers it must not import, at module level or inside a function."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(path: Path, modules: set[str]) -> tuple[set[str], set[str]]:
    """(imports that run, every import) of ``path`` among ``modules``: imports under
    ``if TYPE_CHECKING:`` are only in the second set."""
    module = _module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    runs: set[str] = set()
    every: set[str] = set()

    def targets(node: ast.Import | ast.ImportFrom) -> set[str]:
        if isinstance(node, ast.Import):
            names = {alias.name for alias in node.names}
        else:
            source = _resolve(module, path, node)
            names = {f"{source}.{alias.name}" for alias in node.names} | {source}
        found = set()
        for name in names:  # the module itself, or the package whose attribute it is
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
        return found

    def walk(node: ast.AST, running: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                names = targets(child)
                every.update(names)
                if running:
                    runs.update(names)
            else:
                checking = isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
                walk(child, running and not checking)

    walk(tree, True)
    return runs, every


def _graph() -> tuple[list[str], dict[str, set[str]], dict[str, set[str]]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    names = [_module_name(p) for p in paths]
    modules = set(names)
    runs, every = {}, {}
    for name, path in zip(names, paths, strict=True):
        runs[name], every[name] = _imports(path, modules)
    return names, runs, every


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` as a list of modules (first repeated last), or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle() -> None:
    _, runs, _ = _graph()
    assert _cycle(runs) == []


def test_imports_point_one_way() -> None:
    _, _, every = _graph()
    wrong = [
        f"{source} imports {target}"
        for source, targets in every.items()
        for target in sorted(targets)
        for layer, banned in FORBIDDEN.items()
        if source.startswith(f"tagplan.{layer}")
        and any(target.startswith(f"tagplan.{b}") for b in banned)
    ]
    assert wrong == []
