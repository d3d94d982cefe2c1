# SPDX-License-Identifier: Apache-2.0
"""
Size and shape guards: modules under 500 lines, functions under 80, no import circle between modules.

A class over 300 lines is allowed only with the reason in its docstring (the word "long" there is the
reviewer's cue).
"""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "vla_policy_node"
MAX_MODULE, MAX_CLASS, MAX_FUNCTION = 500, 300, 80


def package_files() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def lines(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def test_no_module_over_500_lines():
    offenders = [f"{p.relative_to(PKG)}: {n}" for p in package_files()
                 if (n := len(p.read_text().splitlines())) > MAX_MODULE]
    assert offenders == []


def test_no_function_over_80_lines():
    offenders = []
    for path in package_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and lines(node) > MAX_FUNCTION:
                offenders.append(f"{path.relative_to(PKG)}:{node.name}: {lines(node)}")
    assert offenders == []


def test_no_class_over_300_lines_without_its_reason():
    offenders = []
    for path in package_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and lines(node) > MAX_CLASS:
                if "long" not in (ast.get_docstring(node) or "").lower():
                    offenders.append(f"{path.relative_to(PKG)}:{node.name}: {lines(node)}")
    assert offenders == []


def import_graph() -> dict[str, set[str]]:
    """Map each module to the package modules it imports (``from pkg.room import x``: module ``x`` if it is one)."""
    modules = {module_name(p): p for p in package_files()}
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                edges.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                             for a in node.names)
        graph[name] = {e for e in edges if e in modules and e != name and not name.startswith(e + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    state, stack = {}, []

    def visit(node: str) -> list[str]:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return []

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


def test_no_import_circle_between_modules():
    assert find_cycle(import_graph()) == []
