"""The import rule (docs/architecture.md), by the second component of a module's name: commands -> outer_loop ->
inner_loop -> evaluation -> agent_trainer.

Every module is parsed with ``ast`` (nothing is imported), including imports inside functions and
``importlib.import_module("...")`` / ``__import__("...")`` with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent_trainer", "evaluation", "inner_loop", "outer_loop")
# Layers are the second component of a module's name: agent_trainer.<layer>.<...>; every other module of
# agent_trainer (config, cli, registry, paths, ...) is the base layer, "agent_trainer".
LAYERS = ("commands", "outer_loop", "inner_loop", "evaluation")
FORBIDDEN = {
    "agent_trainer": {"outer_loop", "inner_loop", "evaluation", "commands"},
    "evaluation": {"outer_loop", "inner_loop", "commands"},
    "inner_loop": {"outer_loop", "commands"},
    "outer_loop": {"commands"},
}


def layer(module: str) -> str | None:
    """The layer of a module of the project, None for any other module (the standard library, torch...)."""
    parts = module.split(".")
    if parts[0] != "agent_trainer":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "agent_trainer"


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
    mine = layer(module)
    return sorted(m for m in imported_modules(source, module) if layer(m) in FORBIDDEN.get(mine, set()))


def modules() -> list[tuple[str, Path]]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            # keep "__init__" so relative imports resolve from the package itself
            out.append((".".join(path.relative_to(ROOT).with_suffix("").parts), path))
    return out


def test_packages_are_scanned():
    names = {m for m, _ in modules()}
    assert {"agent_trainer.config", "agent_trainer.tracking", "agent_trainer.evaluation.tasks",
            "agent_trainer.inner_loop.spec.jobspec"} <= names


@pytest.mark.parametrize("module,path", modules(), ids=[m for m, _ in modules()])
def test_module_respects_the_import_rule(module, path):
    bad = violations(path.read_text(), module)
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}; allowed direction: " \
                    "commands -> outer_loop -> inner_loop -> evaluation -> agent_trainer"


@pytest.mark.parametrize("source,module,expected", [
    ("import agent_trainer.outer_loop.rl.policy", "agent_trainer.inner_loop.run.job",
     ["agent_trainer.outer_loop.rl.policy"]),
    ("def f():\n    from agent_trainer.inner_loop import models", "agent_trainer.evaluation.baselines",
     ["agent_trainer.inner_loop"]),
    ("import importlib\nimportlib.import_module('agent_trainer.outer_loop.episode.tools')",
     "agent_trainer.evaluation.x", ["agent_trainer.outer_loop.episode.tools"]),
    ("from agent_trainer.evaluation.tasks import load_task", "agent_trainer.cli", ["agent_trainer.evaluation.tasks"]),
    ("from ..outer_loop import x", "agent_trainer.inner_loop.sub.mod", []),  # relative: resolves to
                                                                             # agent_trainer.inner_loop.outer_loop
    ("from .. import outer_loop", "agent_trainer.evaluation.sub.__init__", []),  # agent_trainer.evaluation.outer_loop,
                                                                                 # a subpackage
    ("from agent_trainer.evaluation.tasks import load_task", "agent_trainer.inner_loop.run.job", []),
    ("from agent_trainer.tracking import Tracker", "agent_trainer.evaluation.baselines", []),
    ("from agent_trainer.commands.train import run", "agent_trainer.outer_loop.rl.train",
     ["agent_trainer.commands.train"]),
    ("import agent_trainer.inner_loop.run.job", "agent_trainer.config", ["agent_trainer.inner_loop.run.job"]),
])
def test_the_checker_catches_violations(source, module, expected):
    assert violations(source, module) == expected


@pytest.mark.parametrize("room", ["agent_trainer/inner_loop/run", "agent_trainer/outer_loop/rl"])
def test_functions_of_the_job_runner_and_the_trainer_fit_on_a_screen(room):
    """The rooms a newcomer reads first (a job's run, the outer loop) keep every function to 60 lines: each part
    is one job, readable and testable on its own."""
    long = []
    for path in sorted((ROOT / room).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} "
                            f"({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long
