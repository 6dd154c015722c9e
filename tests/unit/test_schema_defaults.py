"""One default per setting: the schema (``agent_trainer/config.py``) holds it, and nothing restates it.

A default written a second time drifts from the first (``agent.temperature`` once had six values across files).
Two checks walk every schema dataclass and its fields' defaults:

- in code: a class mirroring a schema class (two or more fields of its names) whose same-named field has a literal
  default, or a function keyword default equal to a schema default of its name (``temperature=1.0``). A mirror reads
  the schema's value (``temperature: float = AgentConfig.temperature``) or takes it from the config;
- in configs: a YAML file that sets a key to the value it would have without it (the schema's default, the group
  file it extends, or the config an experiment applies to), or chooses a group option that is already the default.

    pytest tests/unit/test_schema_defaults.py
"""

from __future__ import annotations

import ast
from dataclasses import MISSING, fields, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from agent_trainer import config as schema
from agent_trainer.config import COMMAND_SCHEMAS, CONFIG_DIR, GROUP_SCHEMAS, Config

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "agent_trainer"

# Classes (``path:Class``) or fields (``path:Class.field``) that share schema names but are other settings, each with
# why (a test fails when one is gone).
OWN_SETTINGS = {
    "agent_trainer/inner_loop/models/build.py:ModelBuildConfig":
        "the tiny base models' build recipe (steps, lr of their pretraining): part of the built model's identity",
    "agent_trainer/outer_loop/agents/agent_model.py:AgentBuildConfig":
        "the tiny agent's build recipe (its supervised steps and lr): part of the built model's identity",
    "agent_trainer/outer_loop/agents/agent_warm_start.py:WarmStart":
        "a warm start's SFT recipe (its LoRA, epochs, lr, tool format): part of the cached model's identity, so it "
        "must not follow the outer loop's settings",
    "agent_trainer/inner_loop/run/request.py:JobSettings.dry_run":
        "the harness's probe before a job (always on), not the job command's dry_run",
}
# Function arguments of these names are library parameters, not the settings: the root's run-wide values (seed,
# cache_dir, ...), torch's `device` and `dtype` (the config picks the ones passed) and `enabled` (an on-switch of
# many parts; tracking.enabled is read from the config).
LIBRARY_ARGUMENTS = {f.name for f in fields(Config) if f.default_factory is MISSING} | {"device", "dtype", "enabled"}


def schema_classes() -> list[type]:
    """Every schema dataclass: the commands', the groups' and those nested in them."""
    found: list[type] = []
    todo = [*COMMAND_SCHEMAS.values(), *GROUP_SCHEMAS.values(), schema.BaseModelEntry, schema.Intervention]
    while todo:
        cls = todo.pop()
        if cls in found:
            continue
        found.append(cls)
        for f in fields(cls):
            if f.default_factory is not MISSING and is_dataclass(value := f.default_factory()):
                todo.append(type(value))
    return found


def plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def schema_defaults() -> dict[type, dict[str, Any]]:
    """``{schema class: {field: default}}`` for fields with a scalar default."""
    return {cls: {f.name: plain(f.default) for f in fields(cls) if f.default is not MISSING and f.default != "???"}
            for cls in schema_classes()}


def same(a: Any, b: Any) -> bool:
    """Equal as settings: 32 and 32.0 are, True and 1 are not."""
    a, b = plain(a), plain(b)
    return (isinstance(a, bool) == isinstance(b, bool)) and type(a) in (type(b), int, float) and a == b


def _literal(node: ast.expr | None) -> Any:
    try:
        return MISSING if node is None else ast.literal_eval(node)
    except ValueError:
        return MISSING


def restated_in_code(source: str, rel: str, defaults: dict[type, dict[str, Any]]) -> list[str]:
    """``rel:line Owner.name = value (Schema.name)`` for every restated default in ``source``."""
    found = []
    by_name: dict[str, list[tuple[str, Any]]] = {}   # the groups' settings (a command's own keys are its CLI's)
    for cls, values in defaults.items():
        for name, value in values.items() if cls not in COMMAND_SCHEMAS.values() else ():
            by_name.setdefault(name, []).append((cls.__name__, value))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            own = {s.target.id: s for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
            if f"{rel}:{node.name}" in OWN_SETTINGS:
                continue
            own = {name: s for name, s in own.items() if f"{rel}:{node.name}.{name}" not in OWN_SETTINGS}
            mirrors: dict[str, list[str]] = {}   # field -> the schema defaults it mirrors
            for cls, values in defaults.items():
                mirrored = set(own) & {f.name for f in fields(cls)}
                for name in sorted(mirrored & set(values)) if len(mirrored) >= 2 else []:
                    mirrors.setdefault(name, []).append(f"{cls.__name__}.{name} = {values[name]!r}")
            for name, schema_values in sorted(mirrors.items()):
                value = _literal(own[name].value)
                if value is not MISSING and value is not None:
                    found.append(f"{rel}:{own[name].lineno} {node.name}.{name} = {value!r} "
                                 f"({', '.join(sorted(schema_values))})")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = [*zip(positional[len(positional) - len(args.defaults):], args.defaults),
                     *zip(args.kwonlyargs, args.kw_defaults)]
            for arg, default in pairs:
                value = _literal(default)
                if arg.arg in LIBRARY_ARGUMENTS or value is MISSING or value in (None, False, 0):
                    continue
                for owner, want in by_name.get(arg.arg, []):
                    if same(value, want):
                        found.append(f"{rel}:{default.lineno} {node.name}({arg.arg}={value!r}) "
                                     f"({owner}.{arg.arg} = {want!r})")
    return sorted(set(found))


def test_no_default_is_restated_in_code():
    defaults = schema_defaults()
    files = sorted(p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "config.py")
    assert len(files) > 100 and sum(len(v) for v in defaults.values()) > 150, "the walk must see the package"
    found = [hit for p in files for hit in restated_in_code(p.read_text(), str(p.relative_to(ROOT)), defaults)]
    assert not found, ("a schema default written again (read the schema's: Schema.field, or the config):\n"
                       + "\n".join(found))


def test_the_code_check_finds_a_restated_default():
    source = ("class Sampling:\n    temperature: float = 0.9\n    max_new_tokens: int = AgentConfig.max_new_tokens\n"
              "class Other:\n    temperature: float = 1.0\n"
              "def run(steps=13, lr=2e-3, seed=0, heldout_every=None, temperature=0.3, *, kl_beta=0.02):\n    pass\n")
    assert [h.split(" ", 1)[1] for h in restated_in_code(source, "x.py", schema_defaults())] == [
        "Sampling.temperature = 0.9 (AgentConfig.temperature = 1.0, EvaluatorConfig.temperature = 0.7)",
        "run(kl_beta=0.02) (OuterConfig.kl_beta = 0.02)",
        "run(lr=0.002) (OuterConfig.lr = 0.002)",
        "run(steps=13) (OuterConfig.steps = 13)",
    ]


def test_every_exemption_names_a_class_that_exists():
    for entry in OWN_SETTINGS:
        path, name = entry.split(":")
        name, _, field = name.partition(".")
        classes = {n.name: n for n in ast.walk(ast.parse((ROOT / path).read_text())) if isinstance(n, ast.ClassDef)}
        assert name in classes, f"OWN_SETTINGS: {entry} is gone; remove it"
        assert not field or field in {s.target.id for s in classes[name].body if isinstance(s, ast.AnnAssign)}, \
            f"OWN_SETTINGS: {entry} is gone; remove it"


# --- configs --------------------------------------------------------------------------------------


def leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{dotted key: value}`` of a YAML mapping (lists are values)."""
    if not isinstance(node, dict) or not node:
        return {prefix: node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def body(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text()) or {}
    return {k: v for k, v in data.items() if k not in ("defaults", "hydra")}


def unchanged(settings: dict[str, Any], without: Any) -> list[str]:
    """Keys of ``settings`` whose value ``without`` (an OmegaConf node: what they would be, interpolations
    unresolved) already has."""
    plain_without = OmegaConf.to_container(without, resolve=False, enum_to_str=True)
    out = []
    for key, value in leaves(settings).items():
        have: Any = plain_without
        for part in key.split("."):
            have = have.get(part, MISSING) if isinstance(have, dict) else MISSING
        if have is MISSING:
            continue
        if value == have if isinstance(value, (list, dict, str)) or value is None else same(value, have):
            out.append(f"{key}: {value!r}")
    return out


def group_files() -> list[tuple[str, Path]]:
    return sorted((g, p) for g in GROUP_SCHEMAS for p in (CONFIG_DIR / g).rglob("*.yaml"))


@pytest.mark.parametrize("group,path", group_files(), ids=lambda v: v if isinstance(v, str) else v.stem)
def test_a_group_file_sets_only_what_it_changes(group, path):
    """Against the schema's defaults and the same group's files it extends (agent/smollm2 extends tiny_local)."""
    inherited = OmegaConf.structured(GROUP_SCHEMAS[group])
    for entry in (yaml.safe_load(path.read_text()) or {}).get("defaults", []):
        if isinstance(entry, str) and entry not in ("_self_",) and not entry.startswith("/"):
            inherited = OmegaConf.merge(inherited, body(CONFIG_DIR / group / f"{entry}.yaml"))
    restated = unchanged(body(path), inherited)
    assert not restated, f"configs/{group}/{path.stem}.yaml restates {restated}: drop them"


ROOT_CHOICES = {k: v for entry in yaml.safe_load((CONFIG_DIR / "config.yaml").read_text())["defaults"]
                if isinstance(entry, dict) for k, v in entry.items()}


@pytest.fixture(scope="module")
def composer(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        yield lambda overrides, name="config": compose(name, overrides=[f"runs_dir={runs}", *overrides])


@pytest.mark.parametrize("path", sorted((CONFIG_DIR / "experiment").rglob("*.yaml")),
                         ids=lambda p: p.relative_to(CONFIG_DIR / "experiment").with_suffix("").as_posix())
def test_an_experiment_sets_only_what_it_changes(composer, path):
    """Against the root config (any command applies it) with the experiment's group choices and the experiment it
    extends: a value it would have anyway, or a group choice that is already the default, is a second copy."""
    parent, choices, restated = "null", [], []
    for entry in yaml.safe_load(path.read_text()).get("defaults", []):
        if isinstance(entry, str) and entry.startswith("/experiment/"):
            parent = entry.removeprefix("/experiment/")
        elif isinstance(entry, dict):
            (key, option), = entry.items()
            group = key.removeprefix("override ").lstrip("/")
            choices.append(f"{group}={option}")
            if parent == "null" and ROOT_CHOICES.get(group) == option:
                restated.append(f"override /{group}: {option} (configs/config.yaml's choice)")
    without = composer([*([f"experiment={parent}"] if parent != "null" else []), *choices])
    restated += unchanged(body(path), without)
    assert not restated, f"{path.relative_to(ROOT)} restates {restated}: drop them"


@pytest.mark.parametrize("name", sorted(COMMAND_SCHEMAS))
def test_a_command_config_sets_only_what_its_schema_does_not(name):
    """configs/<command>.yaml's own keys against its schema's defaults (configs/config.yaml: the root's)."""
    defaults = OmegaConf.structured(COMMAND_SCHEMAS[name])
    restated = unchanged(body(CONFIG_DIR / f"{name}.yaml"), defaults)
    assert not restated, f"configs/{name}.yaml restates {restated}: drop them (the schema holds them)"
