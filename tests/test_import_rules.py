"""The layering of the package, read from the source with ``ast``: a lower layer imports nothing from a higher one
(:data:`LAYER_RULES`: ``rotvid.rope``, the maths, nothing from ``rotvid.kernels`` or ``rotvid.pipelines``;
``rotvid.pipelines`` nothing from ``rotvid.eval``), and no rotvid modules import each other in a circle.

Every ``import`` statement counts, at module level and inside functions alike (a function-level import is a
dependency deferred, not removed), ``TYPE_CHECKING`` blocks included. An edge goes to the module named:
``import a.b.c`` is an edge to ``a.b.c``; ``from a.b import c`` is an edge to the package ``a.b`` (the statement
reads ``c`` from its namespace, so ``a/b/__init__`` must have run), and to ``a.b.c`` too when that is a module. The
implicit import of a parent package by ``import a.b.c`` (it runs ``a/__init__`` and ``a/b/__init__``) is not an edge: a
package's ``__init__`` importing its own submodules would otherwise always close a circle.
"""

import ast
from pathlib import Path

import pytest

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
            out.add(target)
            out.update(sub for sub in (f"{target}.{alias.name}" for alias in node.names) if sub in known)
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


def test_a_from_import_of_a_submodule_is_an_edge_to_its_package_too(tmp_path):
    src = tmp_path / "mod.py"
    src.write_text("from pkg import sib\nimport pkg.other\nfrom .sub import x\n")
    known = {"pkg", "pkg.mod", "pkg.sib", "pkg.other", "pkg.sub", "pkg.sub.x"}
    assert imports_of("pkg.mod", src, known) == {"pkg", "pkg.sib", "pkg.other", "pkg.sub", "pkg.sub.x"}


# (lower layer, a higher layer it must not import)
LAYER_RULES = [
    ("rotvid.rope", "rotvid.kernels"),
    ("rotvid.rope", "rotvid.pipelines"),
    ("rotvid.pipelines", "rotvid.eval"),
]


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def arrows(graph: dict[str, set[str]], lower: str, higher: str) -> dict[str, list[str]]:
    """``{module of lower: the modules of higher it imports}``, for the modules that import any."""
    found = {m: sorted(d for d in deps if within(d, higher)) for m, deps in graph.items() if within(m, lower)}
    return {m: d for m, d in found.items() if d}


@pytest.mark.parametrize("lower,higher", LAYER_RULES)
def test_a_layer_imports_nothing_from_above(lower, higher):
    assert arrows(import_graph(), lower, higher) == {}


def test_a_layer_rule_sees_an_arrow_up():
    graph = {"rotvid.rope.x": {"rotvid.pipelines.families"}, "rotvid.ropes": {"rotvid.pipelines"}}
    assert arrows(graph, "rotvid.rope", "rotvid.pipelines") == {"rotvid.rope.x": ["rotvid.pipelines.families"]}


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
