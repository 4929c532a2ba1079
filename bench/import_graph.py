"""The import graph of bisector.* and scenarios.*, read with `ast`: cycles, and what a plug-in loads.

Every import statement counts, at module level and inside functions (a function-level import closes a
cycle at run time as surely as a module-level one). Those under `if TYPE_CHECKING:` never run, so they are
counted apart: a circle they close is no start-up hazard, but it still ties modules that should not know
each other, and the tree has none either. An edge goes to the module named, or for
`from package import module` to that module.

    python bench/import_graph.py           # figures and any cycle, one per line
    python bench/import_graph.py --json    # {"modules", "edges", "function_edges", "cycles", "plugin_imports", ...}

Exits 1 when there is a cycle, type-only imports included. tests/test_seams.py runs it.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bisector", "scenarios")
# What a plug-in scenario writes first (examples/plugin-scenario).
PLUGIN_IMPORT = "from scenarios.base import BaseScenario"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module, module: str, is_package: bool,
             type_only: bool) -> list[tuple[str, list[str], bool]]:
    """(imported module, names, inside a function) for every import that runs (type_only: and those under
    `if TYPE_CHECKING:`)."""
    found: list[tuple[str, list[str], bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node) and not type_only:
            for child in node.orelse:
                visit(child, in_function)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, [], in_function) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package this module is in (or is)
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}".rstrip(".")
            found.append((base, [alias.name for alias in node.names], in_function))
        inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, False)
    return found


def import_graph(type_only: bool = False) -> tuple[dict[str, set[str]], set[tuple[str, str]]]:
    """module -> the project modules it imports (type_only: type-checking imports too); and the edges that only
    a function-level import makes."""
    files = {module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in files}
    module_level: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        for imported, names, in_function in _imports(tree, name, path.name == "__init__.py", type_only):
            targets = [f"{imported}.{alias}" for alias in names if f"{imported}.{alias}" in files]
            if len(targets) < len(names) or not names:
                targets.append(imported)
            for target in targets:
                if target in files and target != name:
                    graph[name].add(target)
                    if not in_function:
                        module_level[name].add(target)
    function_only = {(a, b) for a, deps in graph.items() for b in deps if b not in module_level[a]}
    return graph, function_only


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a -> ... -> a) for each strongly connected group of modules that import each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph[node]):
            if dep not in index:
                connect(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for node in sorted(graph):
        if node not in index:
            connect(node)
    return [_cycle_through(group, graph) for group in groups]


def _cycle_through(group: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for dep in sorted(graph[node] & members):
                if dep == start:
                    return paths[node] + [start]
                if dep not in paths:
                    paths[dep] = paths[node] + [dep]
                    following.append(dep)
        frontier = following
    return group


def plugin_imports() -> list[str]:
    """The project modules a fresh interpreter holds after a plug-in's first import."""
    probe = (f"import sys; {PLUGIN_IMPORT}; "
             f"print('\\n'.join(sorted(m for m in sys.modules if m.partition('.')[0] in {PACKAGES!r})))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=ROOT,
                          check=True)
    return done.stdout.split()


def largest_module() -> tuple[str, int]:
    sizes = {str(path.relative_to(ROOT)): len(path.read_text().splitlines())
             for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    name = max(sizes, key=lambda key: sizes[key])
    return name, sizes[name]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    graph, function_only = import_graph()
    found = cycles(graph)
    typed_found = [cycle for cycle in cycles(import_graph(type_only=True)[0]) if cycle not in found]
    loaded = plugin_imports()
    largest, lines = largest_module()
    figures = {"modules": len(graph), "edges": sum(len(deps) for deps in graph.values()),
               "function_edges": sorted(f"{a} -> {b}" for a, b in function_only), "cycles": found,
               "type_only_cycles": typed_found,
               "plugin_import": PLUGIN_IMPORT, "plugin_imports": loaded,
               "largest_module": {"path": largest, "lines": lines}}
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"modules: {figures['modules']}, imports between them: {figures['edges']} "
              f"({len(function_only)} only inside functions)")
        print(f"cycles: {len(found)}")
        for cycle in found:
            print("  " + " -> ".join(cycle))
        print(f"cycles that type-only imports close: {len(typed_found)}")
        for cycle in typed_found:
            print("  " + " -> ".join(cycle))
        print(f"`{PLUGIN_IMPORT}` loads {len(loaded)} project modules: {' '.join(loaded)}")
        print(f"largest module: {largest} ({lines} lines)")
    return 1 if found or typed_found else 0


if __name__ == "__main__":
    sys.exit(main())
