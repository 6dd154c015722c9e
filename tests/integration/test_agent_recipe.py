"""The pretrained agent's recipe (``experiment=smollm2_cpu``): it composes into what docs/agents.md says, and
a one-step version of it runs end to end on the tiny agent (batched sampling, the lean update, held-out start and
end)."""

from __future__ import annotations

import json

import pytest

from agent_trainer.config import compose_config, validate


@pytest.mark.parametrize("recipe", ["smollm2_cpu", "smollm2_cpu/no_kl"])
def test_the_recipe_is_what_the_docs_say(recipe):
    c = validate(compose_config([f"experiment={recipe}"], "train"))
    assert c.agent.model == "smollm2-agent-valid" and c.agent.backend == "local"
    assert (c.agent.max_turns, c.agent.submit_at_turn_limit, c.outer.reward.invalid_job,
            c.outer.reward.validation_without_job) == (6, True, 0.2, 0.25)
    assert (c.outer.lr, c.outer.epochs, c.outer.scale_by_std, c.outer.focus_top_frac) == (3e-4, 1, False, 1.0)
    assert c.outer.tasks_per_step * c.outer.group_size >= 8 and c.outer.tasks_per_step >= 2
    assert c.outer.group_size >= 4 and c.outer.steps >= 12
    assert list(c.task.train_families) == ["calc_chain", "reverse_text", "sort_numbers", "unit_convert", "count_char"]
    assert list(c.task.held_out_families) == ["triage"]
    assert c.outer.heldout_at_start and c.outer.heldout_every > c.outer.steps and c.outer.heldout_episodes >= 8
    assert c.outer.gradient_checkpointing and c.outer.micro_batch_tokens > 0
    if recipe == "smollm2_cpu/no_kl":     # the recipe without its KL term to the warm start, nothing else
        base = validate(compose_config(["experiment=smollm2_cpu"], "train"))
        assert (c.outer.kl_beta, base.outer.kl_beta) == (0.0, 0.1)
        c.outer.kl_beta = base.outer.kl_beta
        c.run_id = base.run_id    # ${now:...}, composed a moment apart
        assert c == base


@pytest.mark.slow
def test_one_step_of_the_recipe_runs_on_the_tiny_agent(tmp_path, built_agent):
    from agent_trainer.commands import train as at_train

    # Shrunk for the suite: the tiny agent (the recipe's warm start is SmolLM2's) with 4 turns, one task of two
    # episodes, one held-out episode and one a training task at the start and end, short hidden evaluations.
    cfg = compose_config([f"runs_dir={tmp_path}", "run_id=recipe", "experiment=smollm2_cpu", "agent=tiny_local",
                          "agent.model=tiny-agent", "agent.max_new_tokens=320", "agent.max_turns=4", "outer.steps=1",
                          "outer.tasks_per_step=1", "outer.group_size=2", "outer.heldout_episodes=1",
                          "outer.train_eval_episodes=1", "inner=fast", "tracking=off"],
                         "train")
    at_train.run(cfg)
    run = tmp_path / "recipe"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["episodes"] == 2.0
    assert rows[0]["update_samples"] >= 1 and "update_skipped" not in rows[0]
    assert "heldout_reward_mean" in rows[0] and "heldout_end_reward_mean" in rows[0]
    # one step: the training families' start and end in its row, and their paired gain over the five tasks
    assert len(rows[0]["train_eval_rewards"]) == len(rows[0]["train_eval_end_rewards"]) == 5
    assert rows[0]["paired_train_episodes"] == 1.0 and "paired_train_gain_lo" in rows[0]
    assert (run / "checkpoints/step_0000/adapter/adapter_model.safetensors").is_file()


def test_the_recipe_on_a_gpu_is_configuration(tmp_path):
    """``hardware=gpu`` with another agent folder: the plan says where the agent samples and how it is updated."""
    from agent_trainer.outer_loop.rl.run_config import execution_plan

    folder = tmp_path / "Qwen3-0.6B"
    plan = execution_plan(compose_config(["experiment=smollm2_cpu", "hardware=gpu", "agent.model=qwen3-agent",
                                          f"+base_models.qwen3-agent.path={folder}"], "train"))
    assert plan["device"] == "cuda" and plan["agent"] == "local on cuda" and plan["agent_model"] == "qwen3-agent"
    assert plan["episodes_per_step"].startswith("2 tasks x 4")
    assert "gradient checkpointing" in plan["update"] and "4096 tokens" in plan["update"]
    assert "shared opening run once" in plan["update"]
    assert plan["evaluations"] == "held-out 1 task x 8 (start, end); training 5 tasks x 8 (start, end)"
