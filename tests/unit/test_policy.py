"""The outer update: group-relative advantages and the clipped policy gradient on a LoRA."""

from __future__ import annotations

import types

import pytest
import torch
from peft import LoraConfig, get_peft_model
from helpers.updates import plain_update
from transformers import Qwen3Config, Qwen3ForCausalLM

from agent_trainer.config import OuterConfig
from agent_trainer.outer_loop.rl.logprobs import collate, token_logprobs
from agent_trainer.outer_loop.rl.objective import TurnSample, group_advantages, merge_turns
from agent_trainer.outer_loop.rl.policy import AgentPolicy


def tiny_policy(lr: float = 1e-2, **kw) -> AgentPolicy:
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)
    model = get_peft_model(Qwen3ForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                             task_type="CAUSAL_LM"))
    return AgentPolicy(model, types.SimpleNamespace(pad_token_id=0), plain_update(lr=lr, micro_batch_size=4, **kw))


def on_policy_samples(policy: AgentPolicy, advantages: list[float]) -> list[TurnSample]:
    out = []
    for i, a in enumerate(advantages):
        ctx, comp = [1, 2, 3 + i], [10 + i, 20, 30]
        batch = collate([TurnSample(ctx, comp, [0.0] * 3, 0.0)], 0)
        with torch.no_grad():
            lp = token_logprobs(policy.model, batch)[0, len(ctx):].tolist()
        out.append(TurnSample(ctx, comp, lp, a))
    return out


def test_group_advantages_subtract_the_group_mean():
    assert group_advantages([1.0, 0.0, 0.5]) == pytest.approx([0.5, -0.5, 0.0])
    scaled = group_advantages([1.0, 0.0], scale_by_std=True)
    assert scaled == pytest.approx([1.0, -1.0], abs=1e-5)
    assert group_advantages([0.3, 0.3]) == [0.0, 0.0]


def test_collate_masks_everything_but_the_sampled_tokens():
    b = collate([TurnSample([5, 6], [7, 8, 9], [-1.0, -2.0, -3.0], 1.0), TurnSample([5], [7], [-0.5], -1.0)], pad_id=0)
    assert b["loss_mask"].tolist() == [[0, 0, 1, 1, 1], [0, 1, 0, 0, 0]]
    assert b["old_logprobs"][0, 2:].tolist() == [-1.0, -2.0, -3.0]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]


def test_update_changes_the_adapter_only_and_moves_probability_toward_positive_advantage():
    pol = tiny_policy()
    samples = on_policy_samples(pol, [1.0, -1.0, 1.0, -1.0])
    before, frozen = pol.trainable_state(), pol.frozen_state()
    old = [sum(s.old_logprobs) for s in samples]
    stats = pol.update(samples)
    after = pol.trainable_state()
    # LoRA's B starts at zero, so the first step moves every B (A's gradient is still zero)
    assert all(not torch.equal(before[k], after[k]) for k in before if "lora_B" in k), "every LoRA B must change"
    assert all(torch.equal(frozen[k], v) for k, v in pol.frozen_state().items()), "base weights must not change"
    # on-policy rollouts: the importance ratio starts at exactly 1
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and stats["tokens"] == 12
    new = [sum(s.old_logprobs) for s in on_policy_samples(pol, [0.0] * 4)]
    assert new[0] > old[0] and new[2] > old[2]      # advantage +1: more likely
    assert new[1] < old[1] and new[3] < old[3]      # advantage -1: less likely
    assert pol.version == 1
    pol.update(on_policy_samples(pol, [1.0, -1.0, 1.0, -1.0]))
    assert all(not torch.equal(before[k], v) for k, v in pol.trainable_state().items()), "every LoRA tensor changes"


def test_zero_advantages_leave_the_policy_and_its_optimizer_unchanged():
    pol = tiny_policy()
    before = pol.trainable_state()
    assert pol.update(on_policy_samples(pol, [0.0, 0.0]))["skipped"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in pol.trainable_state().items())
    pol.update(on_policy_samples(pol, [1.0, -1.0]))  # Adam has momentum now
    moved, version = pol.trainable_state(), pol.version
    opt = {k: {n: t.clone() for n, t in v.items() if torch.is_tensor(t)}
           for k, v in pol.module._optimizer.state_dict()["state"].items()}
    for _ in range(3):  # steps whose episodes all scored the same: no drift by momentum
        assert pol.update(on_policy_samples(pol, [0.0, 0.0, 0.0]))["skipped"] == 1.0
    assert all(torch.equal(moved[k], v) for k, v in pol.trainable_state().items()) and pol.version == version
    after = pol.module._optimizer.state_dict()["state"]
    assert all(torch.equal(t, after[k][n]) for k, v in opt.items() for n, t in v.items())
    pol.config.kl_beta = 0.1  # with a KL term there is a gradient: the step is taken
    pol.update(on_policy_samples(pol, [0.0, 0.0]))
    assert pol.version == version + 1


def test_kl_term_uses_the_base_model_as_reference():
    pol = tiny_policy(kl_beta=0.5)
    stats = pol.update(on_policy_samples(pol, [1.0, -1.0]))
    assert stats["kl"] == pytest.approx(0.0, abs=1e-6)  # LoRA B starts at zero: policy == reference
    stats = pol.update(on_policy_samples(pol, [1.0, -1.0]))
    assert stats["kl"] > 0.0


def test_lr_warms_up_over_optimizer_steps_and_a_restored_policy_continues_the_schedule(tmp_path):
    """lr_warmup_steps=4: the k-th optimizer step (of any update) uses lr * k / 4, then lr; the count
    is Adam's step counter, so a policy restored from a checkpoint picks up where it stopped. The
    first LoRA B move scales with it (Adam's first step moves each weight by lr times its sign)."""
    pol = tiny_policy(lr=1e-2, lr_warmup_steps=4, epochs=2)
    b0 = {k: v for k, v in pol.trainable_state().items() if "lora_B" in k}
    pol.update(on_policy_samples(pol, [1.0, -1.0]))          # 2 epochs: optimizer steps 1 and 2
    assert [g["lr"] for g in pol.module._optimizer.param_groups] == [pytest.approx(2e-2 / 4)]
    plain = tiny_policy(lr=1e-2, epochs=1)
    plain.update(on_policy_samples(plain, [1.0, -1.0]))
    warm = tiny_policy(lr=1e-2, lr_warmup_steps=4, epochs=1)
    warm.update(on_policy_samples(warm, [1.0, -1.0]))
    move = {n: max((p.trainable_state()[k] - b0[k]).abs().max().item() for k in b0) for n, p in
            (("plain", plain), ("warm", warm))}
    assert move["plain"] == pytest.approx(1e-2, rel=1e-3) and move["warm"] == pytest.approx(1e-2 / 4, rel=1e-3)
    pol.save(tmp_path)
    other = tiny_policy(lr=1e-2, lr_warmup_steps=4, epochs=2)
    other.load_state(tmp_path)
    other.update(on_policy_samples(other, [1.0, -1.0]))      # optimizer steps 3 and 4
    assert [g["lr"] for g in other.module._optimizer.param_groups] == [pytest.approx(1e-2)]


def test_checkpoint_restores_adapter_optimizer_and_version(tmp_path):
    pol = tiny_policy()
    pol.update(on_policy_samples(pol, [1.0, -1.0]))
    pol.save(tmp_path)
    other = tiny_policy()
    other.model.load_state_dict(pol.model.state_dict())
    other.load_state(tmp_path)
    assert other.version == 1
    a = pol.module._optimizer.state_dict()["state"]
    b = other.module._optimizer.state_dict()["state"]
    assert a.keys() == b.keys() and all(torch.equal(a[k]["exp_avg"], b[k]["exp_avg"]) for k in a)
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()


def test_episode_aggregation_weighs_each_episode_once_whatever_its_length():
    """With loss_aggregation=episode a long episode's tokens share one episode's weight; with token
    aggregation they outweigh a short one by their count."""
    for agg in ("token", "episode"):
        policy = tiny_policy(loss_aggregation=agg)
        long, short = on_policy_samples(policy, [-1.0, 1.0])
        long.completion_ids, long.old_logprobs = long.completion_ids * 10, [0.0] * 30   # 30 tokens against 3
        batch = collate([long], 0)
        with torch.no_grad():
            long.old_logprobs = token_logprobs(policy.model, batch)[0, len(long.context_ids):].tolist()
        if agg == "episode":
            long.weight, short.weight = 1 / 30, 1 / 3
        # At ratio 1 the loss is -(sum of w * A) / sum(w): token -> -(-30 + 3) / 33; episode -> 0.
        loss = policy.module.training_step(collate([long, short], 0), 0).item()
        assert loss == pytest.approx(27 / 33 if agg == "token" else 0.0, abs=1e-4), (agg, loss)
    with pytest.raises(ValueError, match="loss_aggregation"):
        OuterConfig(loss_aggregation="sequence-ish")


def test_replay_keeps_rollouts_at_most_max_steps_off_policy_old():
    from agent_trainer.outer_loop.rl.objective import mix_replay

    def sample(version: int) -> TurnSample:
        return TurnSample([1], [2], [-0.5], 1.0, policy_version=version)

    for limit, expected in ((0, [3]), (1, [3, 2]), (2, [3, 2, 1])):
        kept: list[TurnSample] = []
        for version in range(4):          # one update per step: fresh samples carry the current version
            used, kept = mix_replay(kept, [sample(version)], version, limit)
        assert sorted((s.policy_version for s in used), reverse=True) == expected, limit
        # what is kept for the next update is never older than the limit after that update
        assert all(4 - s.policy_version <= limit for s in kept)


def test_merged_turns_score_every_agent_token_in_the_context_it_was_sampled_in():
    """An episode's turns folded into one sequence give each agent token the log-prob it gets as its
    own turn sample, and the same loss; a turn whose prompt does not extend the last starts anew."""
    pol = tiny_policy(loss_aggregation="token")
    turn1 = ([1, 2, 3], [10, 11], None)
    turn2 = ([1, 2, 3, 10, 11, 40, 41], [12, 13, 14], None)       # prompt = turn1 + a tool result
    turn3 = ([1, 2, 9, 9], [15], None)                             # re-tokenised differently: new sequence
    turns = []
    for ctx, comp, _ in (turn1, turn2, turn3):
        with torch.no_grad():
            lp = token_logprobs(pol.model, collate([TurnSample(ctx, comp, [0.0] * len(comp), 0.0)], 0))[0, len(ctx):]
        turns.append((ctx, comp, lp.tolist()))
    merged = merge_turns(turns)
    assert [(len(c), m) for c, _, _, m in merged] == [(3, [1, 1, 0, 0, 1, 1, 1]), (4, [1])]
    assert merged[0][1] == [10, 11, 40, 41, 12, 13, 14]
    separate = [TurnSample(c, t, lp, 1.0) for c, t, lp in turns]
    folded = [TurnSample(c, t, lp, 1.0, completion_mask=m) for c, t, lp, m in merged]
    assert sum(s.n_targets for s in folded) == sum(s.n_targets for s in separate) == 6
    for samples in (separate, folded):
        pol.module.norm = float(sum(s.n_targets for s in samples))
        batch = collate(samples, 0)
        with torch.no_grad():
            new = token_logprobs(pol.model, batch)
        got = sorted(round(x, 5) for x in new[batch["loss_mask"].bool()].tolist())
        assert got == sorted(round(x, 5) for _, _, lp in turns for x in lp)
        assert pol.module.training_step(batch, 0).item() == pytest.approx(-1.0, abs=1e-5)  # ratio 1, A = 1


def test_steps_draw_every_training_task_equally_often_and_never_twice_in_a_step():
    """The step's tasks come from seeded shuffles of the training tasks: with tasks_per_step = the
    number of tasks every step plays all of them, with fewer each task comes up as often as the others."""
    from agent_trainer.outer_loop.rl.rollouts import step_tasks

    tasks = [types.SimpleNamespace(name=f"t{i}") for i in range(5)]
    for k in (2, 5):
        steps = [step_tasks(tasks, 0, k, step) for step in range(10)]
        assert all(len(s) == k and len({x.name for x in s}) == k for s in steps)
        counts = {x.name: sum(x in s for s in steps) for x in tasks}
        assert set(counts.values()) == {2 * k}, counts
        assert steps == [step_tasks(tasks, 0, k, step) for step in range(10)]   # a resume replays the same draw
    assert [step_tasks(tasks, 1, k, s) for s in range(3)] != steps[:3]


def test_focus_keeps_the_highest_entropy_tokens_and_weighs_each_episode_once():
    """focus_top_frac: the policy-gradient term covers the top share of agent tokens by entropy;
    with episode aggregation each episode's focused tokens still add up to one episode's weight."""
    import math

    from agent_trainer.outer_loop.rl.logprobs import focus_samples, token_entropies

    pol = tiny_policy(loss_aggregation="episode")
    samples = on_policy_samples(pol, [1.0, -1.0, 1.0, -1.0])
    for i, s in enumerate(samples):
        s.episode_id = f"e{i // 2}"       # two samples per episode
    focused, threshold = focus_samples(pol.model, samples, 0.5, 0, 4, per_episode_weights=True)
    with torch.no_grad():
        ent = token_entropies(pol.model, collate(samples, 0))
    kept, dropped = [], []
    for r, (s, f) in enumerate(zip(samples, focused)):
        start = len(s.context_ids)
        for j, m in enumerate(f.focus_mask):
            (kept if m else dropped).append(float(ent[r, start + j]))
        assert f.completion_mask == s.completion_mask and f.weight == s.weight   # the KL term's tokens are untouched
    assert len(kept) == math.ceil(0.5 * 12) and min(kept) >= max(dropped) and min(kept) == pytest.approx(threshold)
    for ep in ("e0", "e1"):
        mine = [f for f in focused if f.episode_id == ep]
        assert sum(f.pg_weight * f.n_focus for f in mine) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="focus_top_frac"):
        OuterConfig(focus_top_frac=0.0)


def test_unfocused_tokens_carry_no_policy_gradient():
    """A sample whose tokens are all outside the focus adds nothing to the policy-gradient term: the
    loss is that of the focused sample alone (ratio 1, advantage +1: -1)."""
    pol = tiny_policy(loss_aggregation="token")
    pos, neg = on_policy_samples(pol, [1.0, -1.0])
    pos.focus_mask, neg.focus_mask = [1, 1, 1], [0, 0, 0]
    pos.focus_weight = neg.focus_weight = 1.0
    assert pol.module.training_step(collate([pos, neg], 0), 0).item() == pytest.approx(-1.0, abs=1e-5)
    neg.focus_mask = [1, 1, 1]
    assert pol.module.training_step(collate([pos, neg], 0), 0).item() == pytest.approx(0.0, abs=1e-5)


def test_focused_update_moves_the_policy_like_the_plain_one():
    """With focus the update still raises positive-advantage tokens and lowers negative ones."""
    pol = tiny_policy(focus_top_frac=0.5)
    samples = on_policy_samples(pol, [1.0, -1.0, 1.0, -1.0])
    old = [sum(s.old_logprobs) for s in samples]
    stats = pol.update(samples)
    assert 0.4 <= stats["focus_kept"] <= 0.7
    new = [sum(s.old_logprobs) for s in on_policy_samples(pol, [0.0] * 4)]
    assert new[0] > old[0] and new[2] > old[2] and new[1] < old[1] and new[3] < old[3]


def test_reference_focus_ranks_tokens_by_the_warm_start_not_by_the_drifted_policy():
    """focus_entropy_of="reference": the focused tokens are those the adapter-free model is unsure of,
    however far the adapter has moved; "policy" ranks by the current (adapted) model."""
    from agent_trainer.outer_loop.rl.logprobs import focus_samples

    results = {}
    for which in ("policy", "reference"):
        pol = tiny_policy(focus_top_frac=0.5, focus_entropy_of=which)
        torch.manual_seed(1)
        with torch.no_grad():                       # an adapter that has drifted far from zero
            for name, p in pol.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.5)
        samples = on_policy_samples(pol, [1.0, -1.0, 1.0, -1.0])
        with torch.no_grad(), pol.model.disable_adapter():
            _, ref_threshold = focus_samples(pol.model, samples, 0.5, 0, 4, per_episode_weights=False)
        _, pol_threshold = focus_samples(pol.model, samples, 0.5, 0, 4, per_episode_weights=False)
        results[which] = (pol.update(samples)["focus_entropy_threshold"], ref_threshold, pol_threshold)
    assert results["reference"][0] == pytest.approx(results["reference"][1])
    assert results["policy"][0] == pytest.approx(results["policy"][2])
    assert results["reference"][1] != pytest.approx(results["reference"][2])   # the two rankings differ here
    with pytest.raises(ValueError, match="focus_entropy_of"):
        OuterConfig(focus_entropy_of="base")


def test_a_fresh_adapter_is_drawn_from_the_seed(built_agent):
    """Two trainings of one seed start from the same adapter (and the global RNG is left alone)."""
    import torch

    from agent_trainer.outer_loop.rl.policy import AgentPolicy

    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = AgentPolicy.from_pretrained(built_agent, plain_update(lora_r=4), seed=7).trainable_state()
    assert torch.equal(torch.rand(1), before), "the global RNG is untouched"
    b = AgentPolicy.from_pretrained(built_agent, plain_update(lora_r=4), seed=7).trainable_state()
    c = AgentPolicy.from_pretrained(built_agent, plain_update(lora_r=4), seed=8).trainable_state()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if "lora_A" in k)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_policy_is_updated_on_its_device_and_stays_there(device):
    """hardware.agent_device: Lightning trains on that device (bf16 mixed on a GPU) and the model is back there
    after the update (Lightning's teardown moves it to the CPU), where the local backend samples from it."""
    from agent_trainer.outer_loop.rl.policy import device_kwargs

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)
    model = get_peft_model(Qwen3ForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                             task_type="CAUSAL_LM"))
    pol = AgentPolicy(model, types.SimpleNamespace(pad_token_id=0),
                      plain_update(lr=1e-2, micro_batch_size=4, focus_top_frac=0.5),
                      trainer_kwargs=device_kwargs(device))
    assert next(pol.model.parameters()).device.type == device
    samples = []
    for i, a in enumerate([1.0, -1.0, 1.0, -1.0]):
        ctx, comp = [1, 2, 3 + i], [10 + i, 20, 30]
        batch = {k: v.to(device) for k, v in collate([TurnSample(ctx, comp, [0.0] * 3, 0.0)], 0).items()}
        with torch.no_grad():
            samples.append(TurnSample(ctx, comp, token_logprobs(pol.model, batch)[0, len(ctx):].tolist(), a))
    before = pol.trainable_state()
    stats = pol.update(samples)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-2) and stats["tokens"] > 0
    assert all(p.device.type == device for p in pol.model.parameters()), "the model is back on its device"
    assert any(not torch.equal(before[k], v.to(before[k].device)) for k, v in pol.trainable_state().items())
    assert all(t.device.type == device for _, t in pol.merged_weights())


@pytest.mark.skipif(not __import__("pathlib").Path("/proc/self/status").exists(), reason="reads Linux's /proc")
def test_building_a_policy_gives_back_what_the_heap_held_from_earlier_work():
    # A warm start trained in at-train's own process leaves its freed memory in glibc's heap; the policy's
    # allocator setting alone governs only later allocations, so the policy also hands the held memory back.
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import torch
        from agent_trainer.outer_loop.rl.policy import return_large_frees_to_os
        rss = lambda: next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) / 1e6
        blocks = [torch.ones(100_000) for _ in range(1500)]   # 0.6 GB in 400 KB blocks: glibc's heap
        keep = blocks[::50]   # a few stay in use, so the heap's top cannot simply shrink
        del blocks
        held = rss()
        return_large_frees_to_os()
        print(held - rss())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert float(out) >= 0.4
