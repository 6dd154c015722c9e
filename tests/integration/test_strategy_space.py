"""The strategy space end to end: DPO, self-generated data and two-stage jobs run through ``run_job``
(worker process, hidden scoring) on a random-init tiny Qwen3, and ``result.json``'s ``ran`` says what
actually ran; plus the data-source labels of mixed and agent data, and the examples' validation.

    .venv/bin/pytest tests/integration/test_strategy_space.py -q     (~1-2 min on 2 busy cores)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agent_trainer.paths import PROJECT_ROOT
from agent_trainer.evaluation.tasks import TaskSpec, load_task
from agent_trainer.inner_loop.spec.cost import CostModel
from agent_trainer.inner_loop.run.job import RESULT_FILE, _ran, run_job
from agent_trainer.inner_loop.spec.jobspec import JobSpec, describe_strategy, load_job
from agent_trainer.inner_loop.train.stages import prepare_stage
from agent_trainer.inner_loop.train.selfgen import SelfGenError
from agent_trainer.inner_loop.spec.validate import validate_job

FAST_COSTS = CostModel(startup_s=0.0, grpo_step_s=1e-4, grpo_token_s=0.0, sft_step_s=1e-4, sft_sequence_s=0.0,
                       dpo_step_s=1e-4, dpo_pair_s=0.0, sample_token_s=0.0)
TASK = TaskSpec(name="calc_test", family="calc_chain", allowed_base_models=["tiny-s"], hidden_eval_size=16,
                budget={"max_steps": 400, "max_seconds": 60, "max_usd": 0.05})
SOURCE = {"family": "calc_chain", "seed": 1, "size": 32}
# Length is the one thing a random model's samples reliably differ in: a reward with spread.
SHORT = {"functions": [{"name": "length_penalty", "weight": 1.0}]}
SMALL = {"learning_rate": 1e-3, "batch_size": 4, "num_generations": 4, "max_completion_length": 4}
GEN = {"samples_per_prompt": 4, "max_completion_length": 6}


def _job(tmp_path: Path, spec: dict, files: dict | None = None) -> Path:
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.yaml").write_text(yaml.safe_dump({"base_model": "tiny-s", "seed": 0, **spec}))
    for name, text in (files or {}).items():
        (job / name).write_text(text)
    return job


def _run(job: Path, base_dir: Path):
    res = run_job(job, TASK, model_dir=base_dir, cache_dir=job.parent / "cache", progress=False,
                  cost_model=FAST_COSTS, warm_workers=True, threads=1, cache=False)
    on_disk = json.loads((job / "output" / RESULT_FILE).read_text())
    assert on_disk["ran"] == res.ran and res.visible()["ran"] == res.ran
    return res, on_disk


def stage(algorithm, peft="full", data_source="curated", steps=2):
    return {"algorithm": algorithm, "peft": peft, "data_source": data_source, "steps": steps}


@pytest.mark.slow
def test_single_stage_job_records_what_ran(base_dir, tmp_path):
    job = _job(tmp_path, {"algorithm": "sft", "hyperparameters": {**SMALL, "max_steps": 2},
                          "data": {"sources": [SOURCE]}})
    res, on_disk = _run(job, base_dir)
    assert res.status == "ok" and on_disk["ran"] == {"stages": [stage("sft")]}
    assert res.hidden_score is not None


@pytest.mark.slow
def test_dpo_trains_on_pairs_of_its_own_samples(base_dir, tmp_path):
    job = _job(tmp_path, {"algorithm": "dpo", "peft": {"r": 4, "alpha": 8}, "reward": SHORT,
                          "hyperparameters": {**SMALL, "max_steps": 3}, "data": {"sources": [SOURCE]}})
    res, on_disk = _run(job, base_dir)
    assert res.status == "ok", res.detail + res.error
    assert on_disk["ran"] == {"stages": [stage("dpo", "lora", "self_generated", 3)]}
    assert res.algorithm == "dpo+lora" and res.hidden_score is not None
    assert "self-generated" in res.detail and "pairs from 32 prompts x 4 samples" in res.detail
    gen = json.loads((job / "output" / "generation.json").read_text())
    assert gen[0]["kind"] == "preference_pairs" and 0 < gen[0]["kept"] <= 32
    cfg = json.loads((job / "output" / "trl_config.json").read_text())
    assert cfg["beta"] == 0.1 and cfg["loss_type"] == ["sigmoid"] and cfg["per_device_train_batch_size"] == 4
    log = [json.loads(line) for line in (job / "output" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3] and all("rewards/margins" in r for r in log)


@pytest.mark.slow
def test_sft_on_self_generated_data(built_models, tmp_path):
    # tiny-s (pretrained, ends its answers with eos) samples; the family's reward keeps its correct answers.
    job = _job(tmp_path, {"algorithm": "sft", "hyperparameters": {**SMALL, "max_steps": 2},
                          "data": {"sources": [dict(SOURCE, self_generated=GEN)]}})
    res, on_disk = _run(job, built_models["tiny-s"])
    assert res.status == "ok", res.detail + res.error
    assert on_disk["ran"] == {"stages": [stage("sft", data_source="self_generated")]}
    assert "rows from 32 prompts x 4 samples" in res.detail
    gen = json.loads((job / "output" / "generation.json").read_text())
    assert gen[0]["kind"] == "rejection_sampling" and 0 < gen[0]["kept"] < 128


def test_rejection_sampling_keeps_correct_answers_of_the_model(built_models, tmp_path):
    from agent_trainer.evaluation.families import get_family

    spec = _spec(algorithm="sft", reward=None, data={"sources": [dict(SOURCE, self_generated=GEN)]})
    rows, _, source, (st,) = prepare_stage(spec, tmp_path, built_models["tiny-s"], "calc_chain")
    answers = {e.prompt: e.answer for e in get_family("calc_chain").training_examples(seed=1, n=32)}
    assert source == "self_generated" and st.kept == len({(r["prompt"], r["answer"]) for r in rows}) > 0
    assert all(get_family("calc_chain").score_one(r["answer"], answers[r["prompt"]]) == 1.0 for r in rows)


@pytest.mark.slow
def test_two_stages_chain_their_models_and_share_the_budget(base_dir, tmp_path):
    job = _job(tmp_path, {
        "data": {"sources": [SOURCE]}, "reward": SHORT,
        "stages": [{"algorithm": "sft", "hyperparameters": {**SMALL, "learning_rate": 1e-2, "max_steps": 4}},
                   {"algorithm": "grpo", "peft": {"r": 4, "alpha": 8}, "budget_share": 2.0,
                    "hyperparameters": {**SMALL, "learning_rate": 1e-6, "max_steps": 2}}]})
    res, on_disk = _run(job, base_dir)
    assert res.status == "ok", res.detail + res.error
    assert on_disk["ran"] == {"stages": [stage("sft", steps=4), stage("grpo", "lora", steps=2)]}
    assert res.algorithm == "sft+full>grpo+lora" and res.steps == 6 and res.planned_steps == 6
    out = job / "output"
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [(r["step"], r["stage"]) for r in log] == [(1, 1), (2, 1), (3, 1), (4, 1), (5, 2), (6, 2)]
    # Stage 2 starts from stage 1's model: its first probe loss continues stage 1's, far from the start.
    s1 = [r["probe_loss"] for r in log if r["stage"] == 1 and "probe_loss" in r]   # after steps 1 and 4
    s2 = [r["probe_loss"] for r in log if r["stage"] == 2 and "probe_loss" in r]
    assert abs(s2[0] - s1[-1]) < abs(s1[0] - s1[-1]) / 4, (s1, s2)
    assert set(json.loads((out / "trl_config.json").read_text())) == {"stage_1", "stage_2"}
    assert (out / "model" / "model.safetensors").is_file() and not (out / "stage_1" / "model").exists()
    assert res.hidden_score is not None
    assert not res.flagged and not res.contamination.get("trained", {}).get("error"), res.contamination


def _spec(**kw) -> JobSpec:
    return JobSpec.model_validate({"base_model": "tiny-s", "seed": 0, "reward": SHORT, **kw})


def test_data_source_labels_follow_the_rows_that_train(built_models, tmp_path):
    pairs = "".join(json.dumps({"prompt": f"calc: {i}+1=", "answer": str(i + 1), "chosen": str(i + 1),
                                "rejected": "0"}) + "\n" for i in range(5))
    (tmp_path / "pairs.jsonl").write_text(pairs)
    hp = {**SMALL, "max_steps": 1}
    base_dir = built_models["tiny-s"]
    cases = [
        (dict(algorithm="sft", reward=None, hyperparameters=hp,
              data={"sources": [SOURCE, dict(SOURCE, self_generated=GEN)]}), "mixed"),
        (dict(algorithm="dpo", hyperparameters=hp, data={"file": "pairs.jsonl"}), "agent"),
        (dict(algorithm="dpo", hyperparameters=hp, data={"sources": [SOURCE], "file": "pairs.jsonl"}), "mixed"),
    ]
    for raw, label in cases:
        spec = _spec(**raw)
        rows, _, source, _ = prepare_stage(spec, tmp_path, base_dir, "calc_chain")
        assert source == label == describe_strategy(spec)["stages"][0]["data_source"], raw
        if spec.algorithm == "dpo":
            assert all(r["chosen"] and r["rejected"] for r in rows)
    agent_only = prepare_stage(_spec(**cases[1][0]), tmp_path, base_dir, "calc_chain")[0]
    assert sorted(r["prompt"] for r in agent_only) == sorted(f"calc: {i}+1=" for i in range(5))


def test_sampling_that_keeps_nothing_says_what_to_change(base_dir, tmp_path):
    never = {"samples_per_prompt": 2, "max_completion_length": 2, "min_reward": 5.0}
    spec = _spec(algorithm="sft", data={"sources": [dict(SOURCE, self_generated=never)]})
    with pytest.raises(SelfGenError, match="reached min_reward 5; lower min_reward"):
        prepare_stage(spec, tmp_path, base_dir, "calc_chain")
    flat = _spec(algorithm="dpo", reward={"functions": [{"name": "exact_match"}]},
                 hyperparameters={**SMALL, "max_completion_length": 1}, data={"sources": [SOURCE]})
    with pytest.raises(SelfGenError, match="all got the same reward; use a partial-credit reward"):
        prepare_stage(flat, tmp_path, base_dir, "calc_chain")


def test_ran_of_a_killed_child_takes_the_running_stage_steps_from_the_log():
    ran = {"stages": [stage("sft", steps=4), stage("grpo", "lora", steps=0)]}
    log = [{"step": s, "stage": 1 if s <= 4 else 2, "loss": 0.1} for s in range(1, 8)]
    assert _ran(ran, log)["stages"][1]["steps"] == 3 and _ran(ran, log)["stages"][0]["steps"] == 4
    assert _ran(None, []) == {"stages": []}


CALC = load_task(PROJECT_ROOT / "examples/tasks/calc_chain_v1_fast.json")


@pytest.mark.parametrize("name, strategy", [
    ("dpo_full", [("dpo", "full", "self_generated")]),
    ("dpo_lora", [("dpo", "lora", "self_generated")]),
    ("sft_selfgen", [("sft", "full", "self_generated")]),
    ("sft_then_grpo", [("sft", "full", "curated"), ("grpo", "full", "curated")]),
])
def test_strategy_examples_validate_within_the_fast_budget(name, strategy):
    path = PROJECT_ROOT / "examples/jobs" / name
    r = validate_job(path, CALC, dry_run=False)
    assert r.ok and not r.warnings, r.to_text()
    assert r.estimated_cost.seconds < 0.8 * CALC.budget.max_seconds and r.estimated_cost.usd < CALC.budget.max_usd
    planned = describe_strategy(load_job(path))["stages"]
    assert [(s["algorithm"], s["peft"], s["data_source"]) for s in planned] == strategy
