"""The import graph: no import cycle inside a package, and no module uses another module's private names.

    pytest -q tests/unit/test_import_graph.py

Every module of the project's packages is parsed with ``ast`` (nothing is imported). An import
anywhere in a module counts, inside a function too: a cycle held together by a function-level
import is still a cycle. A private name starts with ``_`` and is not a dunder (``__version__`` is
public); both ``from mod import _name`` and ``mod._name`` count, a module's own privates do not. A
private *module* (``agent_trainer/commands/_errors.py``) is its package's business: importing it is not checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent_trainer",)

# Import edges (importer, imported) that close a cycle but are left in place, each with why (none
# today). An entry is cut from the graph before the cycle check, so a new cycle still fails; an
# entry whose import is gone fails too, so the list only shrinks.
KNOWN_EDGES: dict[tuple[str, str], str] = {}

# Private names still used across modules: (user, "module._name") -> why. A new one fails, and one
# that is gone fails until its entry is deleted.
KNOWN_PRIVATE: dict[tuple[str, str], str] = {}


def module_name(path: Path, root: Path = ROOT) -> str:
    """Dotted name of ``path``; a package's ``__init__.py`` is the package itself."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules(root: Path = ROOT, packages=PACKAGES) -> dict[str, Path]:
    return {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attribute accesses on a name, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


class Scan:
    """What one module imports from the project, and which private names of other modules it uses."""

    def __init__(self, source: str, module: str, known: set[str], is_package: bool = False):
        self.module, self.known = module, known
        self.imports: set[str] = set()
        self.private: set[str] = set()  # "other.module._name"
        package = module.split(".") if is_package else module.split(".")[:-1]
        tree = ast.parse(source)
        bound: dict[str, str] = {}  # local name -> project module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self._edge(alias.name)
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        bound[top] = top
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in known:  # ``from pkg import submodule``
                        self._edge(sub)
                        bound[alias.asname or alias.name] = sub
                    else:
                        self._edge(base)
                        if _is_private(alias.name) and base in known and base != module:
                            self.private.add(sub)
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                    self._edge(node.args[0].value)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _is_private(node.attr):
                owner = _dotted(node.value)
                if owner is None:
                    continue
                head, _, rest = owner.partition(".")
                if head not in bound:
                    continue
                target = ".".join(filter(None, [bound[head], rest]))
                if target in known and target != module:
                    self.private.add(f"{target}.{node.attr}")

    def _edge(self, name: str) -> None:
        # ``import a.b.c`` where ``a.b.c`` is a function or class of ``a.b``: the longest known prefix
        parts = name.split(".")
        for n in range(len(parts), 0, -1):
            candidate = ".".join(parts[:n])
            if candidate in self.known:
                if candidate != self.module:
                    self.imports.add(candidate)
                return


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, Scan]:
    """``{module: (source, is_package)}`` -> ``{module: Scan}``."""
    known = set(sources)
    return {m: Scan(src, m, known, is_pkg) for m, (src, is_pkg) in sources.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle through each strongly connected group of modules (Tarjan), as ``[a, b, ..., a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

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
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph.get(v, ()):
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    out = []
    for group in groups:
        start = min(group)
        paths = {start: [start]}
        queue = [start]
        while queue:  # breadth first: the shortest way back to start
            v = queue.pop(0)
            for w in sorted(graph.get(v, ())):
                if w == start:
                    out.append(paths[v] + [start])
                    queue = []
                    break
                if w in group and w not in paths:
                    paths[w] = paths[v] + [w]
                    queue.append(w)
    return sorted(out)


def project_graph() -> dict[str, Scan]:
    return import_graph({m: (p.read_text(), p.name == "__init__.py") for m, p in project_modules().items()})


GRAPH = project_graph()


def test_packages_are_scanned():
    assert {"agent_trainer.inner_loop.run.job", "agent_trainer.inner_loop.train",
            "agent_trainer.outer_loop.episode.episode", "agent_trainer.evaluation.tasks", "agent_trainer.commands.job",
            "agent_trainer.registry"} <= set(GRAPH)
    assert {"agent_trainer.inner_loop.run.result", "agent_trainer.inner_loop.run.worker",
            "agent_trainer.evaluation.tasks"} <= GRAPH["agent_trainer.inner_loop.run.job"].imports


def test_no_import_cycle():
    edges = {m: scan.imports - {w for (v, w) in KNOWN_EDGES if v == m} for m, scan in GRAPH.items()}
    found = "\n".join(" -> ".join(c) for c in cycles(edges))
    assert not found, "import cycles (break them: move the shared helper to a module both import, move a " \
                      f"function to the module that owns its data, or pass a callable):\n{found}"


def test_no_private_name_of_another_module_is_used():
    found = sorted(f"{m} uses {name}" for m, scan in GRAPH.items() for name in scan.private
                   if (m, name) not in KNOWN_PRIVATE)
    assert not found, "private names used across modules (make them public, or move them to where they are " \
                      "used):\n" + "\n".join(found)


def test_the_allow_lists_are_current():
    stale = [f"{v} -> {w}" for v, w in KNOWN_EDGES if w not in GRAPH.get(v, Scan("", v, set())).imports]
    stale += [f"{m} uses {name}" for m, name in KNOWN_PRIVATE if name not in GRAPH.get(m, Scan("", m, set())).private]
    assert not stale, "allow-list entries that no longer apply; delete them:\n" + "\n".join(stale)


SYNTHETIC = {
    "pkg": ("", True),
    "pkg.a": ("from pkg.b import helper\n", False),
    "pkg.b": ("def helper():\n    from pkg import c\n    return c.value\n", False),
    "pkg.c": ("import pkg.a as a_mod\nvalue = a_mod.__doc__\n", False),
    "pkg.d": ("from pkg.a import _write\nfrom pkg.e import __version__\n", False),
    "pkg.e": ("__version__ = '1'\n_own = 1\nprint(_own)\n", False),
    "pkg.f": ("import pkg.e\nfrom pkg import b as bee\nfrom . import a\n"
              "pkg.e._own\nbee._x()\na._y\nobj = object()\nobj._z\n", False),
    "pkg.g": ("from .e import _own\n", False),
}


def test_the_scan_catches_a_cycle_held_by_a_function_level_import():
    graph = import_graph(SYNTHETIC)
    found = cycles({m: s.imports for m, s in graph.items()})
    assert found == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    assert " -> ".join(found[0]) == "pkg.a -> pkg.b -> pkg.c -> pkg.a"
    assert cycles({"x": {"y"}, "y": {"z"}, "z": set()}) == []
    assert cycles({"x": {"x"}}) == [["x", "x"]]


def test_the_scan_catches_private_names_of_other_modules():
    graph = import_graph(SYNTHETIC)
    assert graph["pkg.d"].private == {"pkg.a._write"}  # a dunder is public
    assert graph["pkg.e"].private == set()  # its own private
    assert graph["pkg.f"].private == {"pkg.e._own", "pkg.b._x", "pkg.a._y"}  # not obj._z
    assert graph["pkg.g"].private == {"pkg.e._own"}  # relative import
    assert graph["pkg.f"].imports == {"pkg.e", "pkg.b", "pkg.a"}


@pytest.mark.parametrize("source,module,is_package,expected", [
    ("from . import b", "pkg.a", False, {"pkg.b"}),
    ("from .b import x", "pkg", True, {"pkg.b"}),
    ("from .. import a", "pkg.sub.m", False, {"pkg.a"}),
    ("import pkg.b.thing", "pkg.a", False, {"pkg.b"}),
    ("import importlib\nimportlib.import_module('pkg.b')", "pkg.a", False, {"pkg.b"}),
    ("import json\nfrom os import path", "pkg.a", False, set()),
])
def test_imports_resolve_to_project_modules(source, module, is_package, expected):
    known = {"pkg", "pkg.a", "pkg.b", "pkg.sub", "pkg.sub.m"}
    assert Scan(source, module, known, is_package).imports == expected
