"""The layering of the package, read from the source with ``ast``: ``rotvid.rope`` (the maths) imports nothing from
``rotvid.kernels``, ``rotvid.pipelines`` nothing from ``rotvid.eval``, and no rotvid modules import each other in a
circle.

Every ``import`` statement counts, at module level and inside functions alike (a function-level import is a
dependency deferred, not removed), ``TYPE_CHECKING`` blocks included. An edge goes to the module named:
``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``. The implicit import of a
parent package (``import a.b.c`` runs ``a/__init__`` and ``a/b/__init__``) is not an edge: a package's
``__init__`` importing its own submodules would otherwise always close a circle.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rotvid"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in known else target)
    return {m for m in out if m in known}


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) - {name} for name, path in mods.items()}


def test_the_graph_is_read():
    graph = import_graph()
    assert "rotvid.kernels.dispatch" in graph["rotvid.pipelines.runtime"]
    assert "rotvid.kernels.recipes.registry" in graph["rotvid.kernels.recipes"]
    assert len(graph) > 50


def test_rope_imports_nothing_from_kernels():
    bad = {m: sorted(d for d in deps if d.startswith("rotvid.kernels"))
           for m, deps in import_graph().items() if m.startswith("rotvid.rope")}
    assert not {m: d for m, d in bad.items() if d}


def test_pipelines_import_nothing_from_eval():
    bad = {m: sorted(d for d in deps if d.startswith("rotvid.eval"))
           for m, deps in import_graph().items() if m.startswith("rotvid.pipelines")}
    assert not {m: d for m, d in bad.items() if d}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_among_rotvid_modules():
    assert strongly_connected(import_graph()) == []


def test_the_circle_finder_finds_a_circle():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
