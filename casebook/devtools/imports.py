"""casebook's import graph, and the rules it keeps: `python -m casebook.devtools.imports` prints it.

Every module belongs to one layer (`LAYERS`) and imports only from the layers it may (`MAY_IMPORT`): the formats
and the pure arithmetic under everything; the judging of stored results over them; the run, the kernels and the
site beside each other, each over those; the commands on top. Three rules, each a count the test holds at zero:

- no cycle among casebook's modules, counting the imports inside functions (a function-level import is never
  a way round a cycle);
- no upward import (a module importing from a layer it may not);
- torch and triton only in the run and the kernels, where a kernel runs.

Read from the source with `ast`; nothing is imported.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]

LAYERS = {
    "format": ("paths", "case", "result", "tolerance", "traffic", "stats", "roofline", "stability", "datasheets",
               "provenance", "load"),
    "judging": ("claims", "levels", "evidence", "results", "projection", "history", "validate"),
    "run": ("run",),
    "kernels": ("kernels",),
    "site": ("render",),
    "commands": ("commands", "cli", "devtools", "__init__"),
}
"""Each module's layer, by its first name under `casebook` (`run` is the package `casebook/run/`)."""

MAY_IMPORT = {
    "format": {"format"},
    "judging": {"format", "judging"},
    "run": {"format", "judging", "run", "kernels"},
    "kernels": {"format", "kernels"},
    "site": {"format", "judging", "site"},
    "commands": {"format", "judging", "run", "kernels", "site", "commands"},
}

TORCH = ("torch", "triton")
TORCH_LAYERS = {"run", "kernels"}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    in_function: bool


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    """The module's layer; "unplaced" for a module `LAYERS` does not name (a new one must be given a place)."""
    first = module.split(".")[1] if "." in module else "__init__"
    return next((name for name, firsts in LAYERS.items() if first in firsts), "unplaced")


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, package): p for p in sorted(package.rglob("*.py"))}


def edges(known: dict[str, Path]) -> tuple[list[Edge], list[Edge]]:
    """(imports of casebook modules, imports of torch or triton), each where it is and whether inside a function."""
    ours, heavy = [], []
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        inside: set[int] = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                            for n in ast.walk(f) if n is not f}
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, one level up for each dot past the first
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            for target in dict.fromkeys(targets):
                edge = Edge(name, target, node.lineno, id(node) in inside)
                if target.split(".")[0] in TORCH:
                    heavy.append(edge)
                elif target in known and target != "casebook" and target != name:
                    ours.append(edge)
    return ours, heavy


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@dataclass
class Report:
    edges: list[Edge]
    cycles: list[list[str]]
    upward: list[Edge]
    torch_outside: list[Edge]
    unplaced: list[str]

    @property
    def problems(self) -> int:
        return len(self.cycles) + len(self.upward) + len(self.torch_outside) + len(self.unplaced)


def report(package: Path = PACKAGE) -> Report:
    """The graph of the package at `package` (casebook's own by default) and what breaks its rules."""
    known = modules(package)
    ours, heavy = edges(known)
    graph: dict[str, set[str]] = {}
    for e in ours:
        graph.setdefault(e.source, set()).add(e.target)
    upward = [e for e in ours if layer(e.target) not in MAY_IMPORT.get(layer(e.source), ())]
    torch_outside = [e for e in heavy if layer(e.source) not in TORCH_LAYERS]
    return Report(ours, cycles(graph), upward, torch_outside, sorted(m for m in known if layer(m) == "unplaced"))


def main() -> int:
    r = report()
    by_source: dict[str, list[Edge]] = {}
    for e in r.edges:
        by_source.setdefault(e.source, []).append(e)
    order = [*LAYERS, "unplaced"]
    for source in sorted(by_source, key=lambda m: (order.index(layer(m)), m)):
        top = sorted({e.target.removeprefix("casebook.") for e in by_source[source] if not e.in_function})
        lazy = sorted({e.target.removeprefix("casebook.") for e in by_source[source] if e.in_function})
        print(f"{layer(source):8} {source.removeprefix('casebook.')}: {', '.join(top) or '-'}"
              + (f"  (in functions: {', '.join(lazy)})" if lazy else ""))
    print(f"\n{len(r.cycles)} cycles, {len(r.upward)} upward imports, "
          f"{len(r.torch_outside)} imports of torch or triton outside the run and the kernels, "
          f"{len(r.unplaced)} modules in no layer")
    for m in r.unplaced:
        print(f"unplaced: {m} (give it a layer in casebook.devtools.imports.LAYERS)")
    for c in r.cycles:
        print("cycle: " + " <-> ".join(c))
    for e in r.upward:
        print(f"upward: {e.source}:{e.line} ({layer(e.source)}) imports {e.target} ({layer(e.target)})")
    for e in r.torch_outside:
        print(f"torch: {e.source}:{e.line} ({layer(e.source)}) imports {e.target}")
    return 1 if r.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
