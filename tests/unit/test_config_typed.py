"""Config values are typed once: the objects the code receives carry the validated schema's values.

Every config file is composed and validated. The update, the episodes (``EpisodeSettings``), the steering, the staged
reward and the ledger read the schema's objects themselves; the plain records that travel to a job's process
(``JobSettings``, ``SandboxPolicy``) must hold exactly the schema's values and its defaults; no room copies config
values by hand.
"""

from __future__ import annotations

import ast
from dataclasses import fields, is_dataclass
from enum import Enum
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from agent_trainer import config as schema
from agent_trainer.config import (
    COMMAND_SCHEMAS, CONFIG_DIR, GROUP_SCHEMAS, AgentConfig, BudgetConfig, Config, EvaluatorConfig, HardwareConfig,
    InnerConfig, OuterConfig, StrategyConfig, validate,
)
from agent_trainer.inner_loop.isolation.sandbox import SandboxPolicy
from agent_trainer.inner_loop.run.request import JobSettings
from agent_trainer.outer_loop.rl import run_config
from agent_trainer.outer_loop.episode.episode import Episode, EpisodeSettings
from agent_trainer.outer_loop.rl.train import TrainSettings

ROOT = Path(__file__).resolve().parents[2]
NOT_GROUPS = {"local"}


def config_files() -> list[str]:
    """``group=option`` for every YAML file of every group, and ``@<name>`` for every command's config."""
    groups = sorted(f"{d.name}={f.relative_to(d).with_suffix('').as_posix()}"
                    for d in CONFIG_DIR.iterdir() if d.is_dir() and d.name not in NOT_GROUPS for f in d.rglob("*.yaml"))
    return groups + [f"@{name}" for name in sorted(COMMAND_SCHEMAS)]


@pytest.fixture(scope="module")
def typed(tmp_path_factory):
    """``typed("group=option" | "@command")`` -> the validated ``Config`` (one Hydra context for all)."""
    runs = tmp_path_factory.mktemp("runs")
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        def make(which: str) -> Config:
            name, overrides = (which[1:], []) if which.startswith("@") else ("config", [which])
            if name == "job":
                overrides.append("job_dir=examples/jobs/sft_full")
            return validate(compose(name, overrides=[f"runs_dir={runs}", *overrides]))
        yield make


def plain(value):
    """What a settings object holds for a schema value: enum members as their values, schema objects as dicts."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, list):
        return [plain(v) for v in value]
    if is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in fields(value)}
    return value


def assert_carries(obj, sources: dict[str, tuple[object, str]], not_config: set[str]) -> None:
    """Each field of ``obj`` equals (value and type) ``getattr(node, key)`` of its source in ``sources``
    (the same-named field of the first node that has one when not listed), or is a known non-config field."""
    for f in fields(obj):
        if f.name in not_config:
            continue
        assert f.name in sources, f"{type(obj).__name__}.{f.name} has no source in the schema"
        node, key = sources[f.name]
        want, got = plain(getattr(node, key)), getattr(obj, f.name)
        assert got == want and type(got) is type(want), f"{type(obj).__name__}.{f.name}: {got!r} != {want!r}"


def same_names(cls: type, *nodes) -> dict[str, tuple[object, str]]:
    out: dict[str, tuple[object, str]] = {}
    for node in nodes:
        for f in fields(node):
            if f.name in {g.name for g in fields(cls)}:
                out.setdefault(f.name, (node, f.name))
    return out


@pytest.mark.parametrize("which", config_files())
def test_settings_carry_the_schema_values(typed, which, tmp_path):
    c = typed(which)
    s = run_config.train_settings(c)

    assert s.outer is c.outer and s.seed == c.seed, "the loop and its update read the outer group itself"
    assert s.heldout_tasks == [c.task.spec_pattern.format(family=f) for f in c.task.held_out_families]
    if c.task.train_families:
        assert s.train_tasks == [c.task.spec_pattern.format(family=f) for f in c.task.train_families]

    e = s.episode
    assert e.agent is c.agent and e.budget is c.budget and e.strategy is c.strategy, "episodes read the groups"
    assert e.reward is c.outer.reward, "the staged reward reads the outer group's reward weights"
    assert run_config.episode_settings(c) == e

    job = run_config.job_settings(c)
    assert_carries(job, job_sources(c), not_config=JOB_NOT_CONFIG)
    assert all(getattr(job, k) == getattr(JobSettings(), k) for k in JOB_NOT_CONFIG - {"sandbox"}), \
        "the rest are JobSettings' defaults"
    assert_carries(SandboxPolicy.coerce(job.sandbox), same_names(SandboxPolicy, c.inner), not_config=SANDBOX_NOT_CONFIG)
    assert s.job == job.replace(progress=False)
    with run_config.make_ledger(c, tmp_path) as ledger:
        assert ledger.budget is c.budget, "the ledger's caps are the budget group itself"


# JobSettings fields no config sets; price_per_hour None (not set) prices a job at the cost model's rate.
JOB_NOT_CONFIG = {"model_dir", "cost_model", "dry_run", "progress", "gpus", "wrap", "tracker", "sandbox"}
SANDBOX_NOT_CONFIG = {"reward_memory_gb", "tmp_mb", "bwrap"}


def job_sources(c: Config) -> dict[str, tuple[object, str]]:
    """Where each config-set ``JobSettings`` field comes from (``JobSettings.from_config``)."""
    i, h = c.inner, c.hardware
    return {**same_names(JobSettings, c, i, h), "hidden_n": (i, "eval_size"), "price_per_hour": (h, "usd_per_hour"),
            "threads": (h, "threads_per_job"), "vllm": (h, "inner_vllm")}


def test_tool_limits_come_from_the_episode_settings(typed, tmp_path):
    c = typed("experiment=smoke")
    settings = run_config.episode_settings(c)
    from agent_trainer.evaluation.tasks import load_task

    ep = Episode(backend=None, task=load_task(ROOT / "examples/tasks/calc_chain_v1_tiny.json"),
                 episode_dir=tmp_path / "ep", settings=settings)
    limits = ep.box.limits
    assert (limits.max_turns, limits.max_jobs_per_episode) == (c.agent.max_turns, c.budget.max_jobs_per_episode)


def test_defaults_are_the_schema_defaults():
    """Settings built without a config (tests, benches) get the schema's defaults: one place for each."""
    outer = OuterConfig()
    assert TrainSettings().outer == outer and TrainSettings().seed == Config().seed
    assert EpisodeSettings() == EpisodeSettings(AgentConfig(), BudgetConfig(), StrategyConfig(), outer.reward)
    assert_carries(SandboxPolicy(), same_names(SandboxPolicy, InnerConfig()), not_config=SANDBOX_NOT_CONFIG)
    sources = job_sources(Config(inner=InnerConfig(), hardware=HardwareConfig()))
    assert_carries(JobSettings(), {k: v for k, v in sources.items() if k != "price_per_hour"},
                   not_config=JOB_NOT_CONFIG | {"price_per_hour"})
    assert JobSettings().price_per_hour is None     # not set: the cost model's rate


def test_clip_eps_high_null_means_clip_eps(typed):
    """null (smoke's, seed_scale's) reaches the update as None (the upper clip is then clip_eps)."""
    assert typed("experiment=smoke").outer.clip_eps_high is None
    assert run_config.train_settings(typed("experiment=smoke")).outer.clip_eps_high is None
    assert OuterConfig().clip_eps_high == 0.28
    with pytest.raises(ValueError, match="loss_aggregation"):
        OuterConfig(loss_aggregation="sequence")


# --- no hand copies ------------------------------------------------------------------------------

SCHEMA_FIELDS = {f.name for cls in (*GROUP_SCHEMAS.values(), *COMMAND_SCHEMAS.values(), EvaluatorConfig,
                                    schema.Intervention, schema.BaseModelEntry) for f in fields(cls)}
CONFIG_NAMES = {"cfg", "conf", "c", "o", "a", "h", "b", "s", "e", "i", "t", "agent", "outer", "hardware", "inner",
                "budget", "strategy", "task"}


def hand_copies(source: str, rel: str) -> list[str]:
    """``int(o.lr)``-style casts of a config value (a schema field read off a config-like name) in ``source``."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("int", "float", "str", "bool") and len(node.args) == 1
                    and isinstance(node.args[0], ast.Attribute) and node.args[0].attr in SCHEMA_FIELDS):
                continue
            root = node.args[0]
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in CONFIG_NAMES:
                found.append(f"{rel}:{node.lineno} {fn.name}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("room", ["outer_loop", "commands", "inner_loop"])
def test_no_config_value_is_copied_by_hand(room):
    found = [hit for p in sorted((ROOT / "agent_trainer" / room).rglob("*.py"))
             for hit in hand_copies(p.read_text(), str(p.relative_to(ROOT)))]
    assert not found, "read the typed config (agent_trainer.config.typed / settings_from) instead:\n" + "\n".join(found)


def test_the_hand_copy_check_finds_one():
    sample = "def f(cfg, o):\n    return float(o.lr), int(cfg.outer.steps), str(o.hint), str(o)\n"
    assert [h.split(": ", 1)[1] for h in hand_copies(sample, "x.py")] == ["float(o.lr)", "int(cfg.outer.steps)"]
