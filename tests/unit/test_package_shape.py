"""The package's shape: no import circle, no module over 450 lines, no function over 60 lines,
and ``torchtitan.experimental`` imported only through its two seams."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "torchtitan"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60
EXPERIMENTAL_SEAMS = {"torchtitan.parallel.compose", "torchtitan.optim"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imported(tree: ast.Module, known: set[str], here: str) -> set[str]:
    """The project modules ``tree`` imports (at any depth, outside ``if TYPE_CHECKING``)."""
    found, stack = set(), [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if _type_checking_only(child):
                continue
            stack.append(child)
            if isinstance(child, ast.Import):
                found |= {a.name for a in child.names if a.name in known}
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                for alias in child.names:
                    sub = f"{child.module}.{alias.name}"
                    found.add(sub if sub in known else child.module)
    return {m for m in found if m in known and m != here}


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imported(ast.parse(p.read_text()), known, name) for name, p in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node], _ = 1, path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        state[node], _ = 2, path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_over_the_line_limit():
    long = {name: n for name, p in modules().items() if (n := len(p.read_text().splitlines()))}
    assert {k: v for k, v in long.items() if v > MAX_MODULE_LINES} == {}


def test_no_function_over_the_line_limit():
    too_long = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}.{node.name}: {lines}")
    assert too_long == []


def test_experimental_is_imported_only_through_its_seams():
    importers = {
        name
        for name, deps in import_graph().items()
        if not name.startswith("torchtitan.experimental")
        and any(
            d == "torchtitan.experimental" or d.startswith("torchtitan.experimental.") for d in deps
        )
    }
    assert importers <= EXPERIMENTAL_SEAMS, importers - EXPERIMENTAL_SEAMS
    assert importers, "the seams no longer import torchtitan.experimental: update this test"
