"""The import rule (docs/architecture.md): scripts -> outer_loop -> inner_loop -> evaluation -> agent_trainer.

Every module is parsed with ``ast`` (nothing is imported), including imports inside functions and
``importlib.import_module("...")`` / ``__import__("...")`` with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent_trainer", "evaluation", "inner_loop", "outer_loop")
FORBIDDEN = {
    "agent_trainer": {"outer_loop", "inner_loop", "evaluation", "scripts"},
    "evaluation": {"outer_loop", "inner_loop", "scripts"},
    "inner_loop": {"outer_loop", "scripts"},
    "outer_loop": {"scripts"},
}


def imported_modules(source: str, module: str) -> set[str]:
    """Absolute names of every module ``source`` imports (``module`` is its dotted name, for relative imports)."""
    found: set[str] = set()
    package = module.split(".")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level]
                found.add(".".join(base + ([node.module] if node.module else [])))
            else:
                found.add(node.module or "")
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.add(node.args[0].value)
    return found


def violations(source: str, module: str) -> list[str]:
    top = module.split(".")[0]
    return sorted(m for m in imported_modules(source, module) if m.split(".")[0] in FORBIDDEN.get(top, set()))


def modules() -> list[tuple[str, Path]]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            # keep "__init__" so relative imports resolve from the package itself
            out.append((".".join(path.relative_to(ROOT).with_suffix("").parts), path))
    return out


def test_packages_are_scanned():
    names = {m for m, _ in modules()}
    assert {"agent_trainer.config", "agent_trainer.tracking", "evaluation.tasks", "inner_loop.jobspec"} <= names


@pytest.mark.parametrize("module,path", modules(), ids=[m for m, _ in modules()])
def test_module_respects_the_import_rule(module, path):
    bad = violations(path.read_text(), module)
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}; allowed direction: " \
                    "scripts -> outer_loop -> inner_loop -> evaluation -> agent_trainer"


@pytest.mark.parametrize("source,module,expected", [
    ("import outer_loop.policy", "inner_loop.job", ["outer_loop.policy"]),
    ("def f():\n    from inner_loop import models", "evaluation.baselines", ["inner_loop"]),
    ("import importlib\nimportlib.import_module('outer_loop.tools')", "evaluation.x", ["outer_loop.tools"]),
    ("from evaluation.tasks import load_task", "agent_trainer.cli", ["evaluation.tasks"]),
    ("from ..outer_loop import x", "inner_loop.sub.mod", []),  # relative: resolves to inner_loop.outer_loop
    ("from .. import outer_loop", "evaluation.sub.__init__", []),  # evaluation.outer_loop, a subpackage
    ("from evaluation.tasks import load_task", "inner_loop.job", []),
    ("from agent_trainer.tracking import Tracker", "evaluation.baselines", []),
])
def test_the_checker_catches_violations(source, module, expected):
    assert violations(source, module) == expected
