"""Validation probe: a table of invalid jobs (each with its specific finding), the examples, the dry run.

The table runs without the dry run (fast, no model). The dry-run tests load a random-init tiny
Qwen3 built here with the project's tokenizer: the probe needs a loadable model, not a good one.
"""

from __future__ import annotations

import copy
import json
import os

import pytest
import yaml

from agent_trainer.paths import PROJECT_ROOT
from agent_trainer.evaluation.tasks import load_task, parse_task
from agent_trainer.inner_loop.spec.cost import CostModel
from agent_trainer.inner_loop.spec.validate import validate_job

CALC = load_task(PROJECT_ROOT / "examples/tasks/calc_chain_v1_fast.json")
BASE = {
    "base_model": "tiny-s",
    "algorithm": "grpo",
    "hyperparameters": {"learning_rate": 5e-4, "batch_size": 64, "num_generations": 8, "max_steps": 50},
    "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": 200}]},
    "reward": {"functions": [{"name": "numeric_closeness"}, {"name": "exact_match"}]},
    "seed": 0,
}
DROP = object()
ROW = '{"prompt": "calc: 1+2=", "answer": "3"}\n'


def job(*changes: tuple[str, object]) -> dict:
    """BASE with dotted-path changes applied (DROP removes the key)."""
    out = copy.deepcopy(BASE)
    for path, value in changes:
        *parents, last = path.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        if value is DROP:
            node.pop(last, None)
        else:
            node[last] = value
    return out


WITH_FILE = ("data", {"file": "data.jsonl"})
FILE_REWARD = ("reward", {"functions": [{"name": "mine", "source": "file"}]})
TINY_BUDGET = parse_task({"name": "cheap", "family": "calc_chain", "budget": {"max_usd": 0.0001}})
BIG_MODELS = parse_task({"name": "big", "family": "calc_chain", "allowed_base_models": ["qwen3-0.6b"]})

# (case id, job.yaml (dict, or raw text), other files, task, expected field, message fragment)
INVALID = [
    ("bad_yaml", "base_model: tiny-s\nalgorithm: [grpo\n", {}, CALC, "job.yaml", "not valid YAML"),
    ("yaml_list", "- base_model: tiny-s\n", {}, CALC, "<root>", "not a mapping"),
    ("yaml_empty", "", {}, CALC, "<root>", "empty"),
    ("duplicate_key", "base_model: tiny-s\nbase_model: tiny-m\n", {}, CALC, "job.yaml", "duplicate key"),
    ("unknown_top_key", job(("learning_rate", 1e-3)), {}, CALC, "learning_rate", "Extra inputs"),
    ("unknown_nested_key", job(("hyperparameters.lr", 1e-3)), {}, CALC, "hyperparameters.lr", "Extra inputs"),
    ("missing_base_model", job(("base_model", DROP)), {}, CALC, "base_model", "Field required"),
    ("bad_algorithm", job(("algorithm", "ppo")), {}, CALC, "algorithm", "'grpo', 'sft' or 'dpo'"),
    ("batch_not_int", job(("hyperparameters.batch_size", "lots")), {}, CALC, "hyperparameters.batch_size",
     "valid integer"),
    ("negative_lr", job(("hyperparameters.learning_rate", -1)), {}, CALC, "hyperparameters.learning_rate",
     "greater than 0"),
    ("nan_lr", job(("hyperparameters.learning_rate", float("nan"))), {}, CALC, "hyperparameters.learning_rate",
     "finite"),
    ("peft_not_mapping", job(("peft", "lora")), {}, CALC, "peft", "valid dictionary"),
    ("peft_rank_zero", job(("peft", {"r": 0})), {}, CALC, "peft.r", "greater than or equal to 1"),
    ("one_generation", job(("hyperparameters.num_generations", 1), ("hyperparameters.batch_size", 8)), {}, CALC,
     "hyperparameters.num_generations", "at least 2 generations"),
    ("indivisible_batch", job(("hyperparameters.batch_size", 60)), {}, CALC, "hyperparameters.batch_size",
     "divisible by num_generations"),
    ("grpo_without_reward", job(("reward", DROP)), {}, CALC, "reward", "needs a reward"),
    ("model_not_allowed", job(("base_model", "qwen3-0.6b")), {}, CALC, "base_model", "not allowed for task"),
    ("unknown_model", job(("base_model", "gpt-5")), {}, CALC, "base_model", "unknown base model"),
    ("steps_over_budget", job(("hyperparameters.max_steps", 5000)), {}, CALC, "hyperparameters.max_steps",
     "over the task budget"),
    ("seconds_over_budget", job(("hyperparameters.batch_size", 1024), ("hyperparameters.max_completion_length", 64),
                                ("hyperparameters.max_steps", 300)), {}, CALC, "hyperparameters.max_steps",
     "s budget"),
    ("usd_over_budget", job(), {}, TINY_BUDGET, "hyperparameters.max_steps", "over the task's $"),
    ("no_data", job(("data", {})), {}, CALC, "data.sources", "at least one library source"),
    ("sources_not_list", job(("data", {"sources": {"family": "calc_chain"}})), {}, CALC, "data.sources",
     "valid list"),
    ("unknown_family", job(("data.sources", [{"family": "chess"}])), {}, CALC, "data.sources.0.family",
     "unknown family"),
    ("seed_out_of_range", job(("data.sources", [{"family": "calc_chain", "seed": 2_000_000}])), {}, CALC,
     "data.sources.0.seed", "less than 1000000"),
    ("data_file_missing", job(WITH_FILE), {}, CALC, "data.file", "not found"),
    ("data_file_empty", job(WITH_FILE), {"data.jsonl": "\n"}, CALC, "data.file", "no rows"),
    ("data_file_bad_json", job(WITH_FILE), {"data.jsonl": ROW + "{oops\n"}, CALC, "data.file",
     "line 2: not valid JSON"),
    ("data_file_missing_column", job(WITH_FILE), {"data.jsonl": '{"prompt": "calc: 1+2="}\n'}, CALC, "data.file",
     "missing key 'answer'"),
    ("data_file_number_answer", job(WITH_FILE), {"data.jsonl": '{"prompt": "calc: 1+2=", "answer": 3}\n'}, CALC,
     "data.file", "'answer' must be a string"),
    ("data_file_outside_job", job(("data", {"file": "../secret.jsonl"})), {}, CALC, "data.file",
     "inside the job folder"),
    ("unknown_reward", job(("reward", {"functions": [{"name": "accuracy"}]})), {}, CALC, "reward.functions.0.name",
     "unknown library reward"),
    ("duplicate_reward", job(("reward", {"functions": [{"name": "exact_match"}, {"name": "exact_match"}]})), {},
     CALC, "reward.functions.1.name", "listed twice"),
    ("zero_weights", job(("reward", {"functions": [{"name": "exact_match", "weight": 0}]})), {}, CALC,
     "reward.functions", "every reward weight is 0"),
    ("reward_file_missing", job(FILE_REWARD), {}, CALC, "reward.file", "not found"),
    ("reward_file_syntax", job(FILE_REWARD), {"reward.py": "def mine(prompts, completions:\n    return []\n"},
     CALC, "reward.file", "line 1"),
    ("reward_function_missing", job(FILE_REWARD), {"reward.py": "def other(prompts, completions, **kw):\n"
                                                                "    return []\n"}, CALC,
     "reward.functions.0.name", "defines no function 'mine'"),
    ("reward_file_not_python", job(("reward", {"file": "reward.txt", "functions": [{"name": "exact_match"}]})), {},
     CALC, "reward.file", "Python file"),
]


# The strategy space (docs/jobs.md): dpo, self-generated sources, stages.
STAGED = {"base_model": "tiny-s", "seed": 0, "data": BASE["data"], "reward": BASE["reward"],
          "stages": [{"algorithm": "sft", "hyperparameters": {"batch_size": 32, "max_steps": 100}},
                     {"algorithm": "grpo",
                      "hyperparameters": {"batch_size": 64, "num_generations": 8, "max_steps": 50}}]}


def staged(*changes: tuple[str, object]) -> dict:
    """STAGED with dotted-path changes (an integer part indexes the stages list; DROP removes the key)."""
    out = copy.deepcopy(STAGED)
    for path, value in changes:
        *parents, last = path.split(".")
        node = out
        for p in parents:
            node = node[int(p)] if p.isdigit() else node.setdefault(p, {})
        if value is DROP:
            node.pop(last, None)
        else:
            node[last] = value
    return out


SELFGEN = [{"family": "calc_chain", "size": 100, "self_generated": {}}]
INVALID += [
    ("no_algorithm", job(("algorithm", DROP)), {}, CALC, "algorithm", "Field required"),
    ("dpo_one_sample", job(("algorithm", "dpo"), ("hyperparameters.num_generations", 1)), {}, CALC,
     "hyperparameters.num_generations", "DPO ranks num_generations samples"),
    ("dpo_zero_beta", job(("algorithm", "dpo"), ("hyperparameters.beta", 0)), {}, CALC, "hyperparameters.beta",
     "DPO needs beta > 0"),
    ("pissa_with_dpo", job(("algorithm", "dpo"), ("peft", {"r": 8, "init": "pissa"})), {}, CALC, "peft.init",
     "reference model of dpo"),
    ("olora_with_grpo_kl", job(("peft", {"init": "olora"}), ("hyperparameters.beta", 0.04)), {}, CALC, "peft.init",
     "reference model of grpo with beta 0.04"),
    ("unknown_lora_init", job(("peft", {"init": "svd"})), {}, CALC, "peft.init", "Input should be"),
    ("dpo_file_without_pairs", job(("algorithm", "dpo"), WITH_FILE), {"data.jsonl": ROW}, CALC, "data.file",
     "no chosen/rejected strings"),
    ("selfgen_with_grpo", job(("data.sources", SELFGEN)), {}, CALC, "data.sources.0.self_generated",
     "self_generated makes SFT data"),
    ("selfgen_with_dpo", job(("algorithm", "dpo"), ("data.sources", SELFGEN)), {}, CALC,
     "data.sources.0.self_generated", "dpo builds its own pairs"),
    ("selfgen_zero_samples", job(("algorithm", "sft"), ("data.sources", [dict(SELFGEN[0], self_generated={
        "samples_per_prompt": 0})])), {}, CALC, "data.sources.0.self_generated.samples_per_prompt",
     "greater than or equal to 1"),
    ("selfgen_unknown_key", job(("algorithm", "sft"), ("data.sources", [dict(SELFGEN[0], self_generated={
        "samples": 4})])), {}, CALC, "data.sources.0.self_generated.samples", "Extra inputs"),
    ("selfgen_over_budget", job(("algorithm", "sft"), ("data.sources", [dict(SELFGEN[0], size=100_000, self_generated={
        "samples_per_prompt": 64})])), {}, CALC, "hyperparameters.max_steps", "s of it sampling)"),
    ("stages_and_top_algorithm", staged(("algorithm", "sft")), {}, CALC, "algorithm",
     "a job with stages sets algorithm inside each stage"),
    ("stages_empty", staged(("stages", [])), {}, CALC, "stages", "at least 1 item"),
    ("stages_too_many", staged(("stages", [{"algorithm": "sft"}] * 5)), {}, CALC, "stages", "at most 4 items"),
    ("stage_bad_algorithm", staged(("stages.0.algorithm", "ppo")), {}, CALC, "stages.0.algorithm",
     "'grpo', 'sft' or 'dpo'"),
    ("stage_unknown_key", staged(("stages.0.lr", 1e-3)), {}, CALC, "stages.0.lr", "Extra inputs"),
    ("stage_without_data", staged(("data", DROP)), {}, CALC, "stages.0.data", "stage 1 has no data"),
    ("stage_grpo_without_reward", staged(("reward", DROP)), {}, CALC, "stages.1.reward",
     "algorithm grpo needs a reward"),
    ("stage_indivisible_batch", staged(("stages.1.hyperparameters.batch_size", 60)), {}, CALC,
     "stages.1.hyperparameters.batch_size", "divisible by num_generations"),
    ("stages_over_step_budget", staged(("stages.0.hyperparameters.max_steps", 380)), {}, CALC, "stages",
     "add up to 430"),
    ("stages_over_seconds", staged(("stages.1.hyperparameters.batch_size", 1024),
                                   ("stages.1.hyperparameters.max_completion_length", 64)), {}, CALC, "stages",
     "s budget"),
    ("stage_reward_file_missing", staged(("stages.1.reward", FILE_REWARD[1])), {}, CALC, "stages.1.reward.file",
     "not found"),
]


def write_job(tmp_path, content, files) -> str:
    text = content if isinstance(content, str) else yaml.safe_dump(content)
    (tmp_path / "job.yaml").write_text(text)
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    return str(tmp_path)


@pytest.mark.parametrize("content, files, task, field, fragment",
                         [case[1:] for case in INVALID], ids=[case[0] for case in INVALID])
def test_invalid_job_gives_its_specific_finding(tmp_path, content, files, task, field, fragment):
    report = validate_job(write_job(tmp_path, content, files), task, dry_run=False)
    assert not report.ok
    matches = [f for f in report.errors if f.field == field and fragment in f.message]
    assert matches, report.to_text()
    assert all(f.hint for f in report.errors if f.field != "<internal>"), report.to_text()
    assert not any(f.field == "<internal>" for f in report.findings), report.probe.get("internal_traceback")
    json.dumps(report.to_dict())  # the agent's tool result must serialise


def test_the_table_is_large_and_distinct():
    assert len(INVALID) >= 25
    assert len({(c[4], c[5]) for c in INVALID}) == len(INVALID)
    assert len({c[0] for c in INVALID}) == len(INVALID)


def test_missing_folder_and_missing_job_file_and_bad_task(tmp_path):
    r = validate_job(tmp_path / "nope", CALC)
    assert [(f.field, "does not exist" in f.message) for f in r.findings] == [("job_dir", True)]
    r = validate_job(tmp_path, CALC)
    assert [f.field for f in r.findings] == ["job.yaml"]
    r = validate_job(write_job(tmp_path, job(), {}), tmp_path / "no_task.json", dry_run=False)
    assert [f.field for f in r.errors] == ["task"]


def test_schema_errors_are_all_reported_with_hints(tmp_path):
    bad = job(("hyperparameters.lr", 1), ("peft", {"rank": 8}), ("seed", -1))
    r = validate_job(write_job(tmp_path, bad, {}), CALC, dry_run=False)
    fields = {f.field: f for f in r.errors}
    assert set(fields) == {"hyperparameters.lr", "peft.rank", "seed"}
    assert "allowed keys here: r, alpha, dropout, target_modules" in fields["peft.rank"].hint
    assert "INVALID (3 errors" in r.to_text()


@pytest.mark.parametrize("name", ["grpo_full", "grpo_lora", "sft_full", "sft_lora", "custom_reward"])
def test_example_jobs_validate_ok_within_budget(name):
    r = validate_job(PROJECT_ROOT / "examples/jobs" / name, CALC, dry_run=False)
    assert r.ok and not r.warnings, r.to_text()
    assert 20 < r.estimated_cost.seconds < 0.8 * CALC.budget.max_seconds
    assert r.estimated_cost.usd < CALC.budget.max_usd


def test_advice_warnings_do_not_block(tmp_path):
    sft_with_grpo_bits = job(("algorithm", "sft"), ("hyperparameters.warmup_ratio", 0.1),
                             ("data.sources", [{"family": "reverse_text", "size": 200}]))
    r = validate_job(write_job(tmp_path, sft_with_grpo_bits, {}), CALC, dry_run=False)
    assert r.ok
    assert {f.field for f in r.warnings} == {"reward", "hyperparameters", "hyperparameters.warmup_ratio",
                                             "data.sources.0.family"}
    sparse = job(("reward", {"functions": [{"name": "exact_match"}]}), ("hyperparameters.learning_rate", 3e-3))
    r = validate_job(write_job(tmp_path, sparse, {}), CALC, dry_run=False)
    assert r.ok and {f.field for f in r.warnings} == {"reward.functions", "hyperparameters.learning_rate"}


# --- dry run ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import torch
    from transformers import Qwen3ForCausalLM

    from agent_trainer.inner_loop.models.build import TINY_S, qwen3_config
    from agent_trainer.inner_loop.models.tokenizer import build_tokenizer

    path = tmp_path_factory.mktemp("rand-tiny")
    tok = build_tokenizer()
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(qwen3_config(TINY_S, tok))
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = tok.eos_token_id, tok.pad_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_dry_run_sft_reports_first_loss(model_dir):
    r = validate_job(PROJECT_ROOT / "examples/jobs/sft_full", CALC, model_dir=model_dir)
    assert r.ok, r.to_text()
    assert 3.0 < r.probe["initial_loss"] < 12.0  # random init over a 1.5 K vocabulary: about ln(1536) = 7.3


def test_dry_run_refuses_sft_rows_whose_answers_lie_past_the_cut(tmp_path, model_dir):
    """Training drops a row without loss; a file of rows whose answers all lie past the trainers' 512-token cut
    would leave it no row (a crash after the job's start-up), so the dry run refuses it with the fix."""
    long_row = json.dumps({"prompt": "calc: " + "1+" * 400 + "1=", "answer": "401"}) + "\n"
    sft = job(("algorithm", "sft"), WITH_FILE, ("reward", DROP), ("hyperparameters.num_generations", DROP),
              ("hyperparameters.batch_size", 8))
    r = validate_job(write_job(tmp_path, sft, {"data.jsonl": long_row * 16}), CALC, model_dir=model_dir)
    assert not r.ok and any("past the 512-token cut" in f.message and f.field == "data" for f in r.errors), r.to_text()


def test_dry_run_warns_on_constant_reward(model_dir):
    r = validate_job(PROJECT_ROOT / "examples/jobs/grpo_full", CALC, model_dir=model_dir)
    assert r.ok
    assert len(r.probe["samples"]) == 16
    constant = [f for f in r.warnings if "no spread" in f.message]
    assert constant and r.probe["reward_spread"] == 0.0


def test_dry_run_scores_agent_reward_in_a_child_process(tmp_path, model_dir, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-harness-secret")  # must not reach agent code
    reward = ("import os\n\ndef mine(prompts, completions, answer, **kw):\n"
              "    assert 'OPENAI_API_KEY' not in os.environ\n"
              "    assert os.getpid() != %d\n"
              "    return [float(len(c)) for c in completions]\n" % os.getpid())
    r = validate_job(write_job(tmp_path, job(FILE_REWARD), {"reward.py": reward}), CALC, model_dir=model_dir)
    assert r.ok and not any("no spread" in f.message for f in r.findings), r.to_text()
    assert all(s["rewards"]["mine"] == len(s["completion"]) for s in r.probe["samples"])


@pytest.mark.parametrize("body, field, fragment", [
    ("return [1 / 0 for c in completions]", "reward.functions.0", "ZeroDivisionError"),
    ("return [0.0]", "reward.functions.0", "returned 1 values for 16 completions"),
    ("import sys; sys.exit(3)", "reward.file", "exited with code 3"),
    ("import time; time.sleep(30)", "reward.file", "did not finish within 2 s"),
])
def test_dry_run_turns_reward_failures_into_findings(tmp_path, model_dir, body, field, fragment):
    reward = f"def mine(prompts, completions, **kw):\n    {body}\n"
    r = validate_job(write_job(tmp_path, job(FILE_REWARD), {"reward.py": reward}), CALC, model_dir=model_dir,
                     reward_timeout_s=2)
    assert not r.ok
    assert any(f.field == field and fragment in f.message for f in r.errors), r.to_text()


def test_unavailable_base_model_is_a_finding(tmp_path):
    r = validate_job(write_job(tmp_path, job(("base_model", "qwen3-0.6b"), ("hyperparameters.max_steps", 1)), {}),
                     BIG_MODELS, dry_run=True, cache_dir=tmp_path / "cache",
                     cost_model=CostModel(model_factors={"qwen3-0.6b": 1.0}))
    assert [f.field for f in r.errors] == ["base_model"] and "could not be loaded" in r.errors[0].message
