"""JobSpec schema: every example parses, errors point at fields, cross-field rules hold."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from agent_trainer.paths import PROJECT_ROOT
from agent_trainer.evaluation.tasks import load_task
from agent_trainer.inner_loop.spec.jobspec import (
    JobSpec, JobSpecError, describe_errors, describe_strategy, load_job, parse_job, read_job_yaml, spec_from_json,
    spec_to_json,
)

JOBS = sorted((PROJECT_ROOT / "examples" / "jobs").glob("*/job.yaml"))
TASKS = sorted((PROJECT_ROOT / "examples" / "tasks").glob("*_fast.json"))
TINY_TASKS = sorted((PROJECT_ROOT / "examples" / "tasks").glob("*_tiny.json"))
GRPO = {"base_model": "tiny-s", "algorithm": "grpo", "data": {"sources": [{"family": "calc_chain"}]},
        "reward": {"functions": [{"name": "exact_match"}]}}


def errors_of(raw) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(raw)
    return describe_errors(info.value)


def test_every_example_job_parses():
    assert {p.parent.name for p in JOBS} >= {"grpo_full", "grpo_lora", "sft_full", "sft_lora", "custom_reward"}
    for path in JOBS:
        spec = load_job(path.parent)
        assert spec.hyperparameters.max_steps <= 400, path


def test_every_example_task_parses_with_the_budget_shape():
    families = set()
    for path in TASKS:
        task = load_task(path)
        families.add(task.family)
        assert 200 <= task.budget.max_steps <= 400 and task.budget.max_seconds == 90 and task.hidden_eval_size == 200
    assert families == {"calc_chain", "reverse_text", "sort_numbers", "unit_convert", "count_char", "triage"}
    assert load_task(PROJECT_ROOT / "examples/tasks/triage_v1_fast.json").held_out is True


def test_tiny_tasks_are_the_fast_ones_with_a_cpu_outer_loop_budget():
    """The outer loop's CPU default runs many jobs: *_tiny specs keep each one short."""
    assert {load_task(p).family for p in TINY_TASKS} == {load_task(p).family for p in TASKS}
    for path in TINY_TASKS:
        task = load_task(path)
        assert task.budget.max_steps <= 100 and task.budget.max_seconds <= 45 and task.hidden_eval_size == 100
    assert all(p.name.endswith("_tiny.json") and sorted(p.parent.glob("*.json")) for p in TINY_TASKS)


def test_example_strategies():
    labels = {p.parent.name: load_job(p.parent).strategy_algorithm() for p in JOBS}
    assert labels["grpo_lora"] == "grpo+lora" and labels["sft_full"] == "sft+full"
    custom = load_job(PROJECT_ROOT / "examples/jobs/custom_reward")
    assert custom.uses_agent_code and custom.uses_agent_data
    assert not load_job(PROJECT_ROOT / "examples/jobs/grpo_full").uses_agent_code


def test_cross_field_errors_point_at_the_field():
    bad = dict(GRPO, hyperparameters={"batch_size": 30, "num_generations": 8})
    assert errors_of(bad) == [
        ("hyperparameters.batch_size",
         "batch_size (30) must be divisible by num_generations (8) for GRPO; e.g. batch_size: 24")]
    dup = dict(GRPO, reward={"functions": [{"name": "exact_match"}, {"name": "exact_match"}]})
    (field, msg), = errors_of(dup)
    assert field == "reward.functions.1.name" and "listed twice" in msg
    (field, msg), = errors_of(dict(GRPO, data={}))
    assert field == "data.sources" and "at least one library source" in msg


def test_unknown_library_reward_and_family_list_the_known_names():
    (field, msg), = errors_of(dict(GRPO, reward={"functions": [{"name": "exact"}]}))
    assert field == "reward.functions.0.name" and "exact_match" in msg and "numeric_closeness" in msg
    (field, msg), = errors_of(dict(GRPO, data={"sources": [{"family": "chess"}]}))
    assert field == "data.sources.0.family" and "calc_chain" in msg


@pytest.mark.parametrize("path", ["/etc/passwd", "../other/data.jsonl", "", "a\\b.jsonl"])
def test_data_file_must_stay_inside_the_job(path):
    (field, msg), = errors_of(dict(GRPO, data={"file": path}))
    assert field == "data.file" and "inside the job folder" in msg


def test_sft_needs_no_reward_and_grpo_file_rewards_need_identifiers():
    JobSpec.model_validate({"base_model": "tiny-s", "algorithm": "sft", "data": {"file": "d.jsonl"}})
    (field, _), = errors_of(dict(GRPO, reward={"functions": [{"name": "my-reward", "source": "file"}]}))
    assert field == "reward.functions.0.name"


def test_effective_max_steps_uses_epochs_only_without_max_steps():
    by_epochs = JobSpec.model_validate(dict(GRPO,
                                            hyperparameters={"epochs": 2, "batch_size": 64, "num_generations": 8}))
    assert by_epochs.rows_per_step() == 8
    assert by_epochs.effective_max_steps(100) == 25  # ceil(2 * 100 / 8)
    both = JobSpec.model_validate(dict(GRPO, hyperparameters={"epochs": 2, "max_steps": 7}))
    assert both.effective_max_steps(100) == 7


def test_load_job_messages(tmp_path: Path):
    with pytest.raises(JobSpecError, match="not found"):
        load_job(tmp_path)
    (tmp_path / "job.yaml").write_text("base_model: tiny-s\nalgorithm: sft\nalgorithm: grpo\n")
    with pytest.raises(JobSpecError, match="line 3, column 1 .*duplicate key 'algorithm'"):
        load_job(tmp_path)
    (tmp_path / "job.yaml").write_text("base_model: tiny-s\nalgorithm: sft\ndata: {file: d.jsonl}\nlr: 1\n")
    with pytest.raises(JobSpecError, match="lr: Extra inputs are not permitted"):
        load_job(tmp_path)


def test_read_job_yaml_reads_exponents_without_a_dot_as_text_and_schema_accepts_them(tmp_path: Path):
    # YAML 1.1 reads 5e-4 as a string; pydantic's lax mode turns it into the float the agent meant.
    (tmp_path / "job.yaml").write_text("base_model: tiny-s\nalgorithm: sft\ndata: {file: d.jsonl}\n"
                                       "hyperparameters: {learning_rate: 5e-4}\n")
    assert read_job_yaml(tmp_path / "job.yaml")["hyperparameters"]["learning_rate"] == "5e-4"
    assert load_job(tmp_path).hyperparameters.learning_rate == 5e-4


# --- the strategy space: dpo, self-generated sources, stages ---------------------------------------


STAGED = {"base_model": "tiny-s", "seed": 3, "data": {"sources": [{"family": "calc_chain", "size": 100}]},
          "reward": {"functions": [{"name": "numeric_closeness"}]},
          "stages": [{"algorithm": "sft", "hyperparameters": {"max_steps": 200}},
                     {"algorithm": "dpo", "peft": {"r": 8}, "data": {"sources": [{"family": "calc_chain", "seed": 2}]},
                      "budget_share": 2}]}


def test_stages_are_single_stage_views_with_the_job_defaults():
    spec = JobSpec.model_validate(STAGED)
    sft, dpo = spec.stage_specs()
    assert (sft.algorithm, sft.peft, sft.hyperparameters.max_steps, sft.seed) == ("sft", None, 200, 3)
    assert sft.data is spec.data and sft.reward is spec.reward and dpo.reward is spec.reward
    assert dpo.data.sources[0].seed == 2 and dpo.peft.r == 8 and dpo.base_model == "tiny-s"
    assert spec.budget_shares() == [1.0, 2.0] and spec.strategy_algorithm() == "sft+full>dpo+lora"
    assert describe_strategy(spec) == {"stages": [
        {"algorithm": "sft", "peft": "full", "data_source": "curated", "steps": 200},
        {"algorithm": "dpo", "peft": "lora", "data_source": "self_generated", "steps": 100}]}
    single = JobSpec.model_validate(GRPO)
    assert single.stage_specs() == [single] and single.budget_shares() == [1.0]


def test_strategy_examples_parse_with_their_labels():
    labels = {p.parent.name: load_job(p.parent).strategy_algorithm() for p in JOBS}
    assert labels["dpo_full"] == "dpo+full" and labels["dpo_lora"] == "dpo+lora"
    assert labels["sft_selfgen"] == "sft+full" and labels["sft_then_grpo"] == "sft+full>grpo+full"
    selfgen = load_job(PROJECT_ROOT / "examples/jobs/sft_selfgen").data.sources[0].self_generated
    assert selfgen.samples_per_prompt == 4 and selfgen.min_reward == 1.0


def test_self_generated_flag_and_dpo_beta_defaults():
    sft = {"base_model": "tiny-s", "algorithm": "sft"}
    flag = JobSpec.model_validate(dict(sft, data={"sources": [{"family": "calc_chain", "self_generated": True}]}))
    assert flag.data.sources[0].self_generated.samples_per_prompt == 4
    off = JobSpec.model_validate(dict(sft, data={"sources": [{"family": "calc_chain", "self_generated": False}]}))
    assert off.data.sources[0].self_generated is None
    dpo = JobSpec.model_validate(dict(GRPO, algorithm="dpo", reward=None))
    assert dpo.dpo_beta() == 0.1 and dpo.rows_per_step() == dpo.hyperparameters.batch_size
    assert JobSpec.model_validate(dict(GRPO, algorithm="dpo", hyperparameters={"beta": 0.5})).dpo_beta() == 0.5
    mixed = JobSpec.model_validate(dict(sft, data={"file": "d.jsonl", "sources": [{"family": "calc_chain"}]}))
    assert describe_strategy(mixed)["stages"][0]["data_source"] == "mixed"


def test_stage_errors_point_into_the_stage():
    no_reward = dict(STAGED, reward=None, stages=[{"algorithm": "grpo"}])
    assert errors_of(no_reward) == [("stages.0.reward", "algorithm grpo needs a reward; e.g. reward: "
                                                        "{functions: [{name: exact_match}]}")]
    (field, msg), = errors_of(dict(STAGED, hyperparameters={"max_steps": 5}))
    assert field == "hyperparameters" and "inside each stage" in msg
    (field, msg), = errors_of({"base_model": "tiny-s", "data": {"sources": [{"family": "calc_chain"}]}})
    assert field == "algorithm" and "Field required" in msg
    selfgen_grpo = dict(GRPO, data={"sources": [{"family": "calc_chain", "self_generated": {}}]})
    (field, msg), = errors_of(selfgen_grpo)
    assert field == "data.sources.0.self_generated" and "grpo samples and scores its own completions" in msg


def test_a_source_without_family_is_the_tasks_own(tmp_path: Path):
    from agent_trainer.inner_loop.spec.validate import validate_job

    (tmp_path / "job.yaml").write_text("base_model: tiny-s\nalgorithm: sft\n"
                                       "hyperparameters: {max_steps: 10}\ndata: {sources: [{size: 100}]}\n")
    assert [s.family for s in load_job(tmp_path, "triage").data.sources] == ["triage"]
    with pytest.raises(JobSpecError, match="data.sources.0.family: family missing and no task"):
        load_job(tmp_path)
    # Validated for a task, the job is the task's: no finding about its family, the same job on any task.
    for task in TINY_TASKS[:2]:
        report = validate_job(tmp_path, task, dry_run=False)
        assert report.ok and not [f for f in report.findings if "family" in f.field], report.render()


TWO_STAGES = {"base_model": "tiny-s", "data": {"sources": [{"family": "calc_chain"}]},
              "reward": {"functions": [{"name": "exact_match"}]},
              "stages": [{"algorithm": "sft", "hyperparameters": {"max_steps": 5}},
                         {"algorithm": "grpo", "peft": {"r": 4}, "budget_share": 2.0}]}


@pytest.mark.parametrize("raw", [GRPO, TWO_STAGES, {**GRPO, "hyperparameters": {"learning_rate": 1e-3}}],
                         ids=["grpo", "stages", "hyperparameters"])
def test_a_spec_handed_to_another_process_reads_back_equal(raw):
    """The trainer and the contamination checks get the harness's spec as JSON; a spec they cannot read back
    fails the job's check (it is then scored as its baseline) or its training."""
    spec = parse_job(raw, "calc_chain")
    assert spec_from_json(spec_to_json(spec), "calc_chain") == spec


def test_the_hand_over_leaves_defaults_out_because_a_staged_spec_refuses_them():
    spec = parse_job(TWO_STAGES, "calc_chain")
    with pytest.raises(ValidationError, match="inside each stage"):
        spec_from_json(spec.model_dump_json(), "calc_chain")


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.parent.name)
def test_every_example_job_reads_back_equal_from_its_hand_over(path):
    spec = load_job(path.parent, "calc_chain")
    assert spec_from_json(spec_to_json(spec), "calc_chain") == spec
