"""Every reference in the docs resolves: links, backticked repository paths and dotted names.

A dotted name is checked when its first part is ours: ``agent_trainer.…`` (module by module, then a top-level
name, then a class attribute), a module by the end of its name (``validate.check_spec``), a class
(``JobRunner.run``), a config key (``outer.lr``, the schema's fields) or a job.yaml / task spec key
(``data.file``, ``budget.max_steps``). Names of other libraries (``torch.…``) and of local variables are not.
The code's own references to ``docs/*.md`` files resolve too. Read without importing the package's modules.
"""

from __future__ import annotations

import ast
import re
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
# The research log and the benchmarks' index: their links resolve too (their names are a record, not checked).
LOG = [*sorted((ROOT / "docs" / "results").glob("*.md")), ROOT / "bench" / "README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
TICKED = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
REPO_FOLDERS = ("agent_trainer/", "bench/", "configs/", "docs/", "examples/", "requirements/", "scripts/", "tests/")
FILE_ENDINGS = (".py", ".md", ".yaml", ".yml", ".json", ".jsonl", ".txt", ".db", ".safetensors", ".log", ".toml",
                ".sh", ".gguf", ".bin", ".csv", ".png", ".lock")
NOT_COMMITTED = {"configs/local/default.yaml"}  # a user's own defaults (configs/config.yaml: optional local)


def module_index() -> dict[str, tuple[set[str], dict[str, set[str]]]]:
    """``agent_trainer`` module name -> (its top-level names, {class: attribute names}), from the source."""
    index = {}
    for path in (ROOT / "agent_trainer").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names: set[str] = set()
        classes: dict[str, set[str]] = {}
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = {n.name for n in ast.walk(node) if isinstance(n, (ast.FunctionDef,
                                                                                       ast.AsyncFunctionDef))}
                classes[node.name] |= {t.id for n in ast.walk(node) if isinstance(n, (ast.Assign, ast.AnnAssign))
                                       for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                                       if isinstance(t, ast.Name)}
                classes[node.name] |= {t.attr for n in ast.walk(node) if isinstance(n, (ast.Assign, ast.AnnAssign))
                                       for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                                       if isinstance(t, ast.Attribute)}
        for node in tree.body:   # top level, and inside top-level if/try (optional imports)
            for n in [node, *(ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [])]:
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(n.name)
                elif isinstance(n, (ast.Assign, ast.AnnAssign)):
                    names |= {t.id for tg in (n.targets if isinstance(n, ast.Assign) else [n.target])
                              for t in ast.walk(tg) if isinstance(t, ast.Name)}
                elif isinstance(n, (ast.Import, ast.ImportFrom)):
                    names |= {(a.asname or a.name).split(".")[0] for a in n.names}
        index[name] = (names, classes)
    return index


def key_paths(schema: type, prefix: str = "") -> set[str]:
    """Every dotted key of a dataclass or pydantic schema (``outer.lr``, ``data.file``)."""
    if is_dataclass(schema):
        hints, names = typing.get_type_hints(schema), [f.name for f in fields(schema)]
    else:
        hints = {k: f.annotation for k, f in schema.model_fields.items()}
        names = list(hints)
    out = set()
    for name in names:
        path = prefix + name
        out.add(path)
        for inner in typing.get_args(hints[name]) or (hints[name],):
            if isinstance(inner, type) and (is_dataclass(inner) or issubclass(inner, BaseModel)):
                out |= key_paths(inner, path + ".")
    return out


class Names:
    """Whether a dotted name of the docs is one of ours that exists (None: not ours to check)."""

    def __init__(self):
        from agent_trainer.config import Config
        from agent_trainer.evaluation.tasks import TaskSpec
        from agent_trainer.inner_loop.spec.jobspec import JobSpec

        self.modules = module_index()
        self.classes: dict[str, set[str]] = {}
        for _, classes in self.modules.values():
            for cls, attrs in classes.items():
                self.classes.setdefault(cls, set()).update(attrs)
        self.keys = key_paths(Config) | key_paths(JobSpec) | key_paths(TaskSpec)
        self.key_roots = {k.split(".")[0] for k in self.keys}

    def in_module(self, module: str, rest: list[str]) -> bool:
        if not rest:
            return True
        if f"{module}.{rest[0]}" in self.modules:
            return self.in_module(f"{module}.{rest[0]}", rest[1:])
        names, classes = self.modules[module]
        if rest[0] not in names:
            return False
        return len(rest) == 1 or rest[0] not in classes or rest[1] in classes[rest[0]]

    def resolves(self, name: str) -> bool | None:
        parts = name.split(".")
        if parts[0] == "agent_trainer":
            module = next((".".join(parts[:i]) for i in range(len(parts), 0, -1)
                           if ".".join(parts[:i]) in self.modules), None)
            return module is not None and self.in_module(module, parts[len(module.split(".")):])
        answers = []
        for i in range(len(parts), 0, -1):   # a module by the end of its name: validate.check_spec
            tail = "." + ".".join(parts[:i])
            found = [m for m in self.modules if m.endswith(tail)]
            if found:
                answers.append(any(self.in_module(m, parts[i:]) for m in found))
                break
        if parts[0] in self.classes:
            answers.append(parts[1] in self.classes[parts[0]])
        if parts[0] in self.key_roots:
            answers.append(name in self.keys)
        return any(answers) if answers else None


def ticked(doc: Path) -> list[str]:
    return [m.group(1).strip().removesuffix("()") for m in TICKED.finditer(doc.read_text())]


@pytest.mark.parametrize("doc", DOCS + LOG, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(doc):
    targets = [m.group(1) for m in LINK.finditer(doc.read_text())]
    missing = [t for t in targets if not t.startswith(("http://", "https://", "mailto:", "#"))
               and not (doc.parent / t.split("#")[0]).exists()]
    assert not missing, f"{doc.name}: links to files that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_backticked_paths_exist(doc):
    paths = {t.split()[0].rstrip(".,;:") for t in ticked(doc) if t.startswith(REPO_FOLDERS)}
    missing = sorted(p for p in paths if not set(p) & set("<>{}*$~[]()=,")
                     and p not in NOT_COMMITTED and not exists(p))
    assert not missing, f"{doc.name}: paths that do not exist: {missing}"


def exists(path: str) -> bool:
    """A repository path, or a test's node id (``tests/x.py::test_y``: the file defines the test)."""
    file, _, test = path.partition("::")
    return (ROOT / file).exists() and (not test or f"def {test}(" in (ROOT / file).read_text())


@pytest.fixture(scope="module")
def names() -> Names:
    return Names()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_backticked_dotted_names_exist(doc, names):
    dotted = {t for t in ticked(doc) if DOTTED.match(t) and not t.lower().endswith(FILE_ENDINGS)}
    missing = sorted(t for t in dotted if names.resolves(t) is False)
    assert not missing, f"{doc.name}: names that are not in the code, the config schema or job/task keys: {missing}"


def test_docs_cited_in_the_code_exist():
    cited = {(str(p.relative_to(ROOT)), m) for folder in ("agent_trainer", "tests", "bench", "configs", "scripts")
             for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".yaml", ".sh") and p.is_file()
             for m in re.findall(r"docs/\w+\.md", p.read_text(errors="replace"))}
    missing = sorted(f"{where}: {doc}" for where, doc in cited if not (ROOT / doc).is_file())
    assert not missing, "references to docs that do not exist:\n" + "\n".join(missing)


def test_the_name_check_finds_a_missing_name(names):
    assert names.resolves("agent_trainer.inner_loop.run.job.execute") is True
    assert names.resolves("validate.check_spec") is True and names.resolves("outer.lr") is True
    assert names.resolves("agent_trainer.inner_loop.run.job.no_such_function") is False
    assert names.resolves("validate.no_such_function") is False and names.resolves("outer.no_such_key") is False
    assert names.resolves("torch.cuda.is_available") is None


def test_every_bench_and_script_entry_point_is_listed_in_bench_readme():
    """One place to start each action: a new script in bench/ or scripts/ is listed with its question."""
    listed = (ROOT / "bench" / "README.md").read_text()
    entry_points = [p for folder in ("bench", "scripts") for p in sorted((ROOT / folder).iterdir())
                    if p.suffix in (".py", ".sh") and not p.name.startswith("_")]
    missing = [str(p.relative_to(ROOT)) for p in entry_points if f"`{p.relative_to(ROOT)}" not in listed
               and f"bash {p.relative_to(ROOT)}" not in listed]
    assert not missing, f"bench/README.md does not list: {missing}"
