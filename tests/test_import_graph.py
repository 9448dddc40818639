"""The import graph of engine/, gateway/ and tenants/: no cycles, dependencies one way.

Read from the source (ast), so every import counts: module level, inside functions (lazy) and
under ``TYPE_CHECKING``. An edge names the module whose code the importer needs: ``import a.b``
and ``from a import b`` (``b`` a module) point at ``a.b``, ``from a.b import name`` at ``a.b``.
(Importing ``a.b`` also runs ``a/__init__.py``; that holds for every submodule and is not an
edge of its own.) Checked twice: between modules, and between units (a package's top-level
modules each, its subpackages such as ``gateway.widget`` or ``engine.core.kv`` as one each), so two
subpackages that import each other's modules are a cycle even when no two modules are.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "gateway", "tenants")
TORCH_FREE = ("engine.core.kv", "engine.core.scheduler")  # and everything they import
TORCH = ("torch", "triton")
Edges = dict[str, set[str]]


@dataclass
class Graph:
    edges: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    where: dict[tuple[str, str], str] = field(default_factory=dict)  # edge -> file:line
    external: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    modules: set[str] = field(default_factory=set)
    packages: set[str] = field(default_factory=set)

    def add(self, src: str, dst: str, at: str) -> None:
        if dst != src:
            self.edges[src].add(dst)
            self.where.setdefault((src, dst), at)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def build_graph() -> Graph:
    g = Graph()
    files = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    g.modules = set(files)
    g.packages = {m for m, p in files.items() if p.name == "__init__.py"}
    for mod, path in files.items():
        here = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        for target, line in imports_in(tree, here, g.modules):
            if target in g.modules:
                g.add(mod, target, f"{path.relative_to(ROOT)}:{line}")
            else:
                g.external[mod].add(target.partition(".")[0])
    return g


def imports_in(tree: ast.AST, here: str, modules: set[str]) -> list[tuple[str, int]]:
    """(imported module, line) of every import anywhere in ``tree``; ``here``: its package."""
    return [
        (target, node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for target in _targets(node, here, modules)
    ]


def _targets(node: ast.AST, here: str, modules: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [_deepest(a.name, modules) for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        up = here.split(".")[: len(here.split(".")) - node.level + 1]
        base = ".".join([*up, base] if base else up)
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        out.append(sub if sub in modules else base)
    return out


def _deepest(name: str, modules: set[str]) -> str:
    """``import a.b.c``: the module itself, or the longest known prefix of it."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return name


def unit_of(module: str, packages: set[str]) -> str:
    top, _, rest = module.partition(".")
    sub = f"{top}.{rest.partition('.')[0]}" if rest else top
    return sub if sub in packages and sub != top else module


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one node, as a path that
    starts and ends on the same node (Tarjan, then a shortest way back inside the SCC)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(comp)

    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    return [_way_back(min(c), c, edges) for c in sccs]


def _way_back(start: str, comp: set[str], edges: dict[str, set[str]]) -> list[str]:
    paths = {w: [start, w] for w in sorted(edges.get(start, ())) if w in comp}
    frontier = list(paths)
    while start not in paths:
        nxt = []
        for v in frontier:
            for w in sorted(edges.get(v, ())):
                if w in comp and w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    return paths[start]


def describe(cycle: list[str], where: dict[tuple[str, str], str], edges: Edges) -> str:
    """The cycle edge by edge (where each import is), then everything caught in it with it."""
    steps = [f"{a} -> {b}  ({where[(a, b)]})" for a, b in pairwise(cycle)]
    caught = sorted(_component(cycle[0], edges))
    return "\n    ".join([*steps, f"(all in this cycle: {', '.join(caught)})"])


def _component(start: str, edges: Edges) -> set[str]:
    """The nodes that reach ``start`` and are reached from it: its strongly connected set."""

    def reach(src: str, step: Edges) -> set[str]:
        seen, todo = {src}, [src]
        while todo:
            for w in step.get(todo.pop(), ()):
                if w not in seen:
                    seen.add(w)
                    todo.append(w)
        return seen

    back: Edges = defaultdict(set)
    for v, ws in edges.items():
        for w in ws:
            back[w].add(v)
    return reach(start, edges) & reach(start, back)


def unit_graph(g: Graph) -> tuple[dict[str, set[str]], dict[tuple[str, str], str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    where: dict[tuple[str, str], str] = {}
    for src, dsts in g.edges.items():
        for dst in dsts:
            a, b = unit_of(src, g.packages), unit_of(dst, g.packages)
            if a != b:
                edges[a].add(b)
                where.setdefault((a, b), f"{g.where[(src, dst)]}: {src} -> {dst}")
    return edges, where


GRAPH = build_graph()


def test_the_graph_sees_lazy_and_type_checking_imports() -> None:
    """The reader is not blind: imports inside functions and under TYPE_CHECKING are edges."""
    code = (
        "if TYPE_CHECKING:\n    from engine.core.kv import pool\n"
        "def f():\n    import engine.runtime.runner\n"
    )
    found = imports_in(ast.parse(code), "engine", GRAPH.modules)
    assert sorted(found) == [("engine.core.kv.pool", 2), ("engine.runtime.runner", 4)]
    assert "engine.runtime.runner" in GRAPH.edges["engine.serving.engine"]  # inside from_pretrained
    assert "gateway.cluster.bootstrap" in GRAPH.edges["gateway.lifecycle.engine_source"]  # lazy
    assert "torch" in GRAPH.external["engine.runtime.runner"]
    assert GRAPH.where[("gateway.app", "gateway.lifecycle.engine_source")].startswith(
        "gateway/app.py:"
    )


def test_the_cycle_finder_names_the_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert find_cycles(edges) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_import_cycles() -> None:
    cycles = find_cycles(GRAPH.edges)
    assert not cycles, "import cycles between modules:\n  " + "\n  ".join(
        describe(c, GRAPH.where, GRAPH.edges) for c in cycles
    )


def test_no_import_cycles_between_subpackages_and_modules() -> None:
    edges, where = unit_graph(GRAPH)
    cycles = find_cycles(edges)
    assert not cycles, "import cycles between units:\n  " + "\n  ".join(
        describe(c, where, edges) for c in cycles
    )


def test_dependencies_point_one_way() -> None:
    """gateway -> tenants, gateway -> engine; engine and tenants know nothing of each other or
    of the gateway."""
    forbidden = {"engine": ("gateway", "tenants"), "tenants": ("gateway", "engine")}
    wrong = [
        f"{src} -> {dst}  ({GRAPH.where[(src, dst)]})"
        for src, dsts in GRAPH.edges.items()
        for dst in dsts
        if dst.partition(".")[0] in forbidden.get(src.partition(".")[0], ())
    ]
    assert not wrong, "imports against the dependency direction:\n  " + "\n  ".join(wrong)


def test_the_kv_cache_and_the_scheduler_reach_no_torch() -> None:
    """Everything engine/core/kv and engine/core/scheduler.py import, transitively, lazily
    included."""
    seen: dict[str, list[str]] = {
        m: [m] for m in GRAPH.modules if m in TORCH_FREE or m.startswith("engine.core.kv.")
    }
    frontier = list(seen)
    while frontier:
        mod = frontier.pop()
        for dst in GRAPH.edges.get(mod, ()):
            if dst not in seen:
                seen[dst] = [*seen[mod], dst]
                frontier.append(dst)
    wrong = [
        " -> ".join([*path, lib])
        for mod, path in sorted(seen.items())
        for lib in sorted(GRAPH.external[mod] & set(TORCH))
    ]
    assert not wrong, "torch reached from the torch-free core:\n  " + "\n  ".join(wrong)


ENGINE_LAYERS = (
    "engine.core",
    "engine.runtime",
    "engine.serving",
)  # each may import those before it


def engine_layer(mod: str) -> int | None:
    return next((i for i, p in enumerate(ENGINE_LAYERS) if mod.startswith(p + ".")), None)


def test_engine_layers_import_downwards_only() -> None:
    """serving -> runtime -> core: the core never reaches the model runtime or serving, the
    runtime never reaches serving. (The boundary modules engine/*.py sit outside the order:
    ``engine.api`` names the runtime's Tokenizer type, ``engine`` exports lazily.)"""
    wrong = []
    for src, dsts in GRAPH.edges.items():
        for dst in dsts:
            here, there = engine_layer(src), engine_layer(dst)
            if here is not None and there is not None and there > here:
                wrong.append(f"{src} -> {dst}  ({GRAPH.where[(src, dst)]})")
    assert not wrong, "engine imports against the layer order:\n  " + "\n  ".join(wrong)


# The engine's boundary: the only engine modules the gateway imports (docs/structure.md), all
# torch-free, so the gateway installs and runs without torch (``pip install kvgate``).
BOUNDARY = (
    "engine.api",
    "engine.params",
    "engine.outputs",
    "engine.errors",
    "engine.constraints",
    "engine.config",
    "engine.text",
    "engine.remote",
)
# The one gateway module that starts engines (a local worker, ``kvgate worker``, the in-process
# engine, the demo model's weights): it imports the engine below the boundary, lazily, and only
# where the engine extra is installed.
LAUNCHER = "gateway.cluster.local"


def in_boundary(module: str) -> bool:
    return any(module == b or module.startswith(b + ".") for b in BOUNDARY)


def test_the_gateway_imports_only_the_engine_boundary() -> None:
    wrong = [
        f"{src} -> {dst}  ({GRAPH.where[(src, dst)]})"
        for src, dsts in GRAPH.edges.items()
        if src.startswith("gateway.") and src != LAUNCHER
        for dst in dsts
        if dst.startswith("engine.") and not in_boundary(dst)
    ]
    assert not wrong, "gateway imports below the engine's boundary:\n  " + "\n  ".join(wrong)
    launched = {d for d in GRAPH.edges[LAUNCHER] if d.startswith("engine.") and not in_boundary(d)}
    assert launched, f"{LAUNCHER} starts no engine any more: drop it from the rule"


def test_the_boundary_reaches_no_torch() -> None:
    """Everything the boundary imports, transitively (lazily included), is torch-free."""
    seen = {m: [m] for m in GRAPH.modules if in_boundary(m)}
    frontier = list(seen)
    while frontier:
        mod = frontier.pop()
        for dst in GRAPH.edges.get(mod, ()):
            if dst not in seen:
                seen[dst] = [*seen[mod], dst]
                frontier.append(dst)
    wrong = [
        " -> ".join([*path, lib])
        for mod, path in sorted(seen.items())
        for lib in sorted(GRAPH.external[mod] & set(TORCH))
    ]
    assert not wrong, "torch reached from the engine's boundary:\n  " + "\n  ".join(wrong)
    assert "engine.text.tokenizer" in seen and "engine.remote.client" in seen
