"""Every config file composes into its typed schema; typos and impossible combinations fail early."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from agent_trainer import cli
from agent_trainer.config import (
    COMMAND_SCHEMAS, CONFIG_DIR, GROUP_SCHEMAS, Config, ConfigError, EvalCommand, JobCommand, field_help, validate,
)

REQUIRED_GROUPS = {"agent", "task", "budget", "hardware", "outer", "inner", "strategy", "tracking", "experiment",
                   "model"}
NOT_GROUPS = {"local"}  # optional personal overrides, usually absent


def group_files() -> list[tuple[str, str]]:
    """(group, option) for every YAML file on disk, so new files are covered automatically."""
    return sorted(
        (d.name, f.relative_to(d).with_suffix("").as_posix())   # experiment/smollm2_cpu/no_kl.yaml: smollm2_cpu/no_kl
        for d in CONFIG_DIR.iterdir() if d.is_dir() and d.name not in NOT_GROUPS
        for f in d.rglob("*.yaml")
    )


@pytest.fixture(scope="module")
def composer(tmp_path_factory):
    """compose(overrides, name) inside one Hydra context (initialising Hydra per call is slower)."""
    runs = tmp_path_factory.mktemp("runs")
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        yield lambda overrides=(), name="config": compose(name, overrides=[f"runs_dir={runs}", *overrides])


def test_required_groups_exist_and_have_files():
    groups = {g for g, _ in group_files()}
    assert REQUIRED_GROUPS <= groups, f"missing config groups: {REQUIRED_GROUPS - groups}"
    assert {"cpu_default", "smoke"} <= {o for g, o in group_files() if g == "experiment"}
    assert {"qwen3-0.6b", "qwen3-1.7b", "tiny-s", "tiny-m"} <= {o for g, o in group_files() if g == "model"}


@pytest.mark.parametrize("group,option", group_files())
def test_every_config_file_composes_and_validates(composer, group, option):
    cfg = composer([f"{group}={option}"])
    obj = validate(cfg)
    assert type(obj) is Config
    if group in GROUP_SCHEMAS:
        assert type(getattr(obj, group)) is GROUP_SCHEMAS[group]


@pytest.mark.parametrize("group,option", [(g, o) for g, o in group_files() if g in GROUP_SCHEMAS])
def test_every_group_file_extends_its_schema(group, option):
    raw = yaml.safe_load((CONFIG_DIR / group / f"{option}.yaml").read_text())
    assert f"/base/{group}@_here_" in raw.get("defaults", []), (
        f"configs/{group}/{option}.yaml must start with `defaults: [/base/{group}@_here_, _self_]`"
    )


@pytest.mark.parametrize("name,schema", sorted(COMMAND_SCHEMAS.items()))
def test_command_configs_compose_into_their_schema(composer, name, schema):
    overrides = ["job_dir=examples/jobs/sft_full"] if schema is JobCommand else []
    obj = validate(composer(overrides, name))
    assert type(obj) is schema


def test_root_config_groups_default_to_one_cpu_job_at_a_time(composer):
    """configs/config.yaml alone (no experiment): the sequential executor, the local agent, tiny-s on calc_chain."""
    obj = validate(composer())
    assert (obj.hardware.device, obj.hardware.executor, obj.agent.backend) == ("cpu", "sequential", "local")
    assert obj.model.name == "tiny-s" and obj.task.spec_path.endswith("calc_chain_v1_fast.json")


def test_overrides_and_experiments_apply(composer):
    obj = validate(composer(["experiment=smoke", "outer.lr=3e-4", "task=mixed", "model=qwen3-0.6b"]))
    assert obj.outer.lr == pytest.approx(3e-4) and obj.outer.steps == 2
    # the experiment (applied after the task group) narrows the training families of task=mixed
    assert obj.task.train_families == ["calc_chain", "count_char"] and obj.model.name == "qwen3-0.6b"
    assert obj.task.held_out_families == []   # smoke evaluates no held-out family (heldout_every 0): it lists none


def test_tracking_uri_is_an_absolute_sqlite_path_in_the_runs_folder(composer, tmp_path):
    obj = validate(composer([f"runs_dir={tmp_path}"]))
    assert obj.tracking.tracking_uri == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    assert obj.tracking.artifact_location == f"{tmp_path.resolve()}/mlartifacts"


@pytest.mark.parametrize("override,name", [("outer.lrr=1", "lrr"), ("agent.tempreature=0.5", "tempreature"),
                                           ("table=true", "table")])
def test_mistyped_key_fails_naming_the_key(composer, override, name):
    with pytest.raises((HydraException, OmegaConfBaseException)) as err:
        composer([override])
    line = cli.one_line(err.value)
    assert name in line and "\n" not in line


@pytest.mark.parametrize("override,text", [("outer.lr=fast", "outer.lr"), ("model=qwen9", "qwen3-0.6b")])
def test_bad_values_fail_with_the_choices(composer, override, text):
    with pytest.raises((HydraException, OmegaConfBaseException)) as err:
        composer([override])
    line = cli.one_line(err.value)
    assert text in line and "base" not in line.split("options:")[-1] and "\n" not in line


@pytest.mark.parametrize("overrides,text", [
    (["hardware.max_parallel_jobs=2"], "hardware.executor=sequential"),
    # executors and backends: checked against the registries the code builds them from (one list of names)
    (["hardware.executor=cluster"], "hardware.executor: unknown executor 'cluster'; known: local_parallel, ray,"),
    (["agent.backend=llamacpp"], "agent.backend: unknown agent backend 'llamacpp'; known: local, openai, vllm"),
    (["strategy.evaluator.backend=x"], "strategy.evaluator.backend: unknown agent backend 'x'"),
    (["agent=openai", "agent.api_key_env=sk-proj-abcdefghijklmnop"], "NAME of an environment variable"),
    (["agent=openai", "agent.api_key_env=null"], "api_key_env"),
    (["outer.group_size=1"], "group_size"),
    (["strategy=switch", "strategy.interventions.0.message=' '"], "strategy.interventions.0.message"),
    (["strategy.interventions=[{after_job: 0, message: x}]"], "after_job must be >= 1"),
    (["strategy.evaluator.kind=llm", "strategy.evaluator.backend=openai"], "strategy.evaluator.api_key_env"),
    (["task.held_out_families=[calc_chain]"], "calc_chain"),
    (["budget.max_usd_per_run=0"], "budget.max_usd_per_run"),
    (["outer.focus_top_frac=0"], "outer.focus_top_frac"),
    (["hardware.agent_threads=0"], "hardware.agent_threads"),
    (["agent.tool_format=hermez"], "agent.tool_format: unknown tool-call format 'hermez'; known: hermes, llama3"),
])
def test_impossible_combinations_are_rejected(composer, overrides, text):
    with pytest.raises(ConfigError, match=text.replace(".", r"\.").replace("(", r"\(")):
        validate(composer(overrides))


@pytest.mark.parametrize("name,override,text", [
    ("config", "hardware.cpu_kernels=fast", "Invalid value 'fast', expected one of [native, portable]"),
    ("config", "agent.tool_schemas=compakt", "expected one of [full, compact, names]"),
    ("config", "agent.tool_choice=always", "expected one of [auto, required, none]"),
    ("config", "agent.sampler=remote", "expected one of [auto, served]"),
    ("config", "outer.loss_aggregation=sequence", "expected one of [token, episode]"),
    ("config", "outer.focus_entropy_of=base", "expected one of [policy, reference]"),
    ("eval", "prompt_format=html", "expected one of [raw, chat]"),
    ("models", "action=bogus", "expected one of [build, import, calibrate, ship]"),
    ("models", "algorithms=[sft,ppo]", "Invalid value 'ppo', expected one of [sft, grpo, dpo]"),
    ("models", "formats=[chatml]", "expected one of [raw, chat]"),
])
def test_a_choice_outside_its_list_fails_when_composed_naming_the_choices(composer, name, override, text):
    """Every choice setting is an enum of the schema: a wrong value fails at composition, one line naming the key
    and the values it takes."""
    with pytest.raises((HydraException, OmegaConfBaseException)) as err:
        composer([override], name=name)
    line = cli.one_line(err.value)
    assert override.split("=")[0] in line and text in line and "\n" not in line


def test_a_base_model_entry_is_checked_by_the_schema(composer):
    assert validate(composer(["action=calibrate", "algorithms=[sft,dpo]", "formats=[chat]"], name="models"))
    entry = ["+base_models.mine.path=/models/mine"]
    assert validate(composer([*entry, "+base_models.mine.dtype=bfloat16"])).base_models["mine"].dtype == "bfloat16"
    with pytest.raises(ConfigError, match=r"base_models\.mine\.dtype: Invalid value 'int8', expected one of "
                                          r"\[float32, bfloat16, float16\]"):
        validate(composer([*entry, "+base_models.mine.dtype=int8"]))


def test_a_registered_executor_is_a_valid_setting_with_no_other_edit(composer):
    from agent_trainer.inner_loop.run.executor import EXECUTORS, SequentialExecutor

    EXECUTORS.register("mine", lambda **o: (SequentialExecutor, o))
    try:
        assert validate(composer(["hardware.executor=mine"])).hardware.executor == "mine"
    finally:
        EXECUTORS.unregister("mine")


def test_every_schema_field_is_documented():
    for schema in [*GROUP_SCHEMAS.values(), *COMMAND_SCHEMAS.values()]:
        undocumented = [f for f, h in field_help(schema).items() if not h]
        assert not undocumented, f"{schema.__name__}: fields without help: {undocumented}"


def test_rewrite_args_task_forms_and_positional():
    spec = "examples/tasks/reverse_text_v1_fast.json"
    out = cli.rewrite_args([f"task={spec}", "outer.lr=1e-3"])
    assert out[0] == f"task.spec_path={(cli.PROJECT_ROOT / spec).resolve()}" and out[1] == "outer.lr=1e-3"
    assert cli.rewrite_args(["task=mixed"]) == ["task=mixed"]  # a config in configs/task/
    assert cli.rewrite_args(["task=triage_v1_fast"])[0].endswith("examples/tasks/triage_v1_fast.json")
    assert cli.rewrite_args(["examples/jobs/sft_full", "--cfg", "job"], positional="job_dir") == [
        "job_dir=examples/jobs/sft_full", "--cfg", "job"]
    with pytest.raises(cli.UserError, match="known: .*calc_chain_v1_fast"):
        cli.rewrite_args(["task=nope"])
    with pytest.raises(cli.UserError, match="not found"):
        cli.rewrite_args(["task=missing/spec.json"])
    with pytest.raises(cli.UserError, match="key=value"):
        cli.rewrite_args(["stray"])


def test_start_run_writes_resolved_config_and_versions(composer, tmp_path):
    cfg = composer([f"runs_dir={tmp_path}", "run_id=r1", "seed=7"], "eval")
    folder = cli.start_run(cfg)
    assert folder == (tmp_path / "r1").resolve()
    assert OmegaConf.load(folder / "config.resolved.yaml").seed == 7
    versions = json.loads((folder / "versions.json").read_text())
    assert {"python", "torch", "transformers", "trl", "peft", "lightning", "mlflow"} <= set(versions)
    assert versions["torch"] and versions["mlflow"]


def test_default_run_id_is_a_timestamp_pinned_to_the_folder(composer, tmp_path):
    cfg = composer([f"runs_dir={tmp_path}"])
    folder = cli.start_run(cfg)
    assert Path(folder).parent == tmp_path.resolve() and cfg.run_id == folder.name and folder.name[:2] == "20"


def test_eval_schema_types(composer):
    obj = validate(composer(["table=true"], "eval"))
    assert isinstance(obj, EvalCommand) and obj.table is True


def test_missing_required_value_says_how_to_give_it(composer):
    with pytest.raises(ConfigError, match="job_dir has no value; give the job folder as the first argument"):
        validate(composer([], "job"))


def test_sweeps_are_checked_with_their_first_value():
    assert cli.overrides_to_check(["-m", "outer.lr=1e-4,3e-4", "seed=range(2,4)", "a=b"]) == [
        "outer.lr=0.0001", "seed=2", "a=b"]
    assert cli.overrides_to_check(["outer.lr=1"]) == ["outer.lr=1"]
    assert cli.overrides_to_check(["--cfg", "job", "outer.lr=1"]) is None  # Hydra's own flags: Hydra checks


def test_agent_threads_leave_the_parallel_jobs_their_cores(composer):
    """at-train's own torch threads: what the jobs running alongside leave (at least 1), or the set value."""
    from agent_trainer.outer_loop.rl.run_config import agent_threads

    assert agent_threads(composer(["hardware=cpu_parallel"]), cores=2) == 1     # 2 jobs x 1 thread on 2 cores
    assert agent_threads(composer(["hardware=cpu_parallel"]), cores=8) == 6
    assert agent_threads(composer(["hardware=cpu_parallel", "hardware.agent_threads=3"]), cores=2) == 3
    # SLURM's jobs may run elsewhere, but the count is the local executor's: changing the executor changes no number
    assert agent_threads(composer(["hardware=slurm"]), cores=8) == 1
    assert agent_threads(composer(["hardware=slurm", "hardware.agent_threads=8"]), cores=8) == 8
