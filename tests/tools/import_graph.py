"""The repository's import graph, read from the source (module- and function-level imports, no execution).

    python -m tests.tools.import_graph            # the package map of docs/architecture.md (who imports whom)
    python -m tests.tools.import_graph --cycles   # import circles between modules (none expected)

`tests/test_import_graph.py` checks that there is no circle and that docs/architecture.md shows this map.
"""

from __future__ import annotations

import argparse
import ast
import collections
import os
import sys

from tests.tools import REPO

ROOTS = ("zaya_jax", "launch", "experiments", "benchmarks")
# the rooms of the package map, (room, module prefixes), in layers: a room imports only rooms listed above it; a
# module is in the first room whose prefix matches (benchmarks.peers is part of benchmarks/, below launch/: no
# launcher runs it)
ROOMS = (
    ("errors", ("zaya_jax.errors",)),
    ("keys", ("zaya_jax.keys",)),
    ("hardware", ("zaya_jax.hardware",)),
    ("host_memory", ("zaya_jax.host_memory",)),
    ("config", ("zaya_jax.config",)),
    ("parallel", ("zaya_jax.parallel",)),
    ("kernels", ("zaya_jax.kernels",)),
    ("model", ("zaya_jax.model",)),
    ("data", ("zaya_jax.data",)),
    ("train", ("zaya_jax.train",)),
    ("checkpoint", ("zaya_jax.checkpoint",)),
    ("hf", ("zaya_jax.hf",)),
    ("inference", ("zaya_jax.inference",)),
    ("planning", ("zaya_jax.planning",)),
    ("bench", ("zaya_jax.bench",)),
    ("launch/", ("launch",)),
    ("experiments/", ("experiments",)),
    ("benchmarks/", ("benchmarks",)),
)


def modules() -> dict[str, str]:
    """{dotted module name: file path} of every .py file under ROOTS (a package is its __init__)."""
    found = {}
    for root in ROOTS:
        for directory, _, files in os.walk(os.path.join(REPO, root)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(directory, name)
                    dotted = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                    found[dotted.removesuffix(".__init__")] = path
    return found


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement refers to: `from p import name` is p.name when that is a module
    (a submodule import), else p."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    return [f"{base}.{alias.name}" for alias in node.names]


def edges() -> dict[str, set[str]]:
    """{module: the modules of this repository it imports}, from every import statement anywhere in its file."""
    known = modules()

    def resolve(name: str) -> str | None:  # the module itself, else the package holding the name
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = collections.defaultdict(set)
    for module, path in known.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in _imported(node, module, path.endswith("__init__.py")):
                    target = resolve(name)
                    if target and target != module:
                        graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (each is an import circle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def room(module: str) -> str:
    for name, prefixes in ROOMS:
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return name
    return "zaya_jax"  # the package's own __init__


def room_edges(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """{room: the other rooms it imports}, rooms in ROOMS order."""
    order = [name for name, _ in ROOMS]
    out: dict[str, set[str]] = {name: set() for name in order}
    for module, targets in graph.items():
        for target in targets:
            a, b = room(module), room(target)
            if a != b and a in out and b in out:
                out[a].add(b)
    return {name: sorted(out[name], key=order.index) for name in order}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """'a -> b' for each module of a room that imports a module of a room listed below it (none expected)."""
    order = [name for name, _ in ROOMS] + ["zaya_jax"]
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if order.index(room(target)) > order.index(room(module))
    )


def package_map(graph: dict[str, set[str]]) -> str:
    """The Markdown table of docs/architecture.md: each room and the rooms it imports."""
    lines = ["| package | imports (module- or function-level) |", "|---|---|"]
    for name, targets in room_edges(graph).items():
        lines.append(f"| {name} | {', '.join(targets) if targets else '(nothing of the repository)'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", action="store_true", help="list import circles instead of the map")
    args = parser.parse_args()
    graph = edges()
    if args.cycles:
        circles = cycles(graph)
        print("\n".join(" <-> ".join(c) for c in circles) or "no import circle")
    else:
        print(package_map(graph))


if __name__ == "__main__":
    main()
