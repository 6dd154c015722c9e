"""The update's log-probs only where the loss is: equal to the full-vocabulary log-softmax over every position,
and the same loss and gradients; micro-batches cut by tokens; gradient checkpointing changes no number.

Tiny Qwen3 models built in memory (no built models needed); SmolLM2's check is in
tests/integration/test_real_agent_update.py."""

from __future__ import annotations

import types

import pytest
import torch
from helpers.logprobs import full_logprobs, loss_and_grads
from helpers.updates import plain_update

from agent_trainer.outer_loop.rl.logprobs import (
    collate, micro_batches, shared_length, token_entropies, token_logprobs,
)
from agent_trainer.outer_loop.rl.objective import TurnSample
from agent_trainer.outer_loop.rl.policy import AgentPolicy


def tiny_policy(seed=0, **kw) -> AgentPolicy:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
                      max_position_embeddings=512)
    return _wrap(Qwen3ForCausalLM(cfg), kw)


def _wrap(model, kw) -> AgentPolicy:
    from peft import LoraConfig, get_peft_model

    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    for name, p in peft.named_parameters():   # LoRA B starts at 0: make the adapter do something
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    return AgentPolicy(peft, types.SimpleNamespace(pad_token_id=0), plain_update(lr=1e-2, **kw))


def samples(n=5, seed=1) -> list[TurnSample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ctx = torch.randint(1, 300, (int(torch.randint(5, 40, (1,), generator=g)),), generator=g).tolist()
        comp = torch.randint(1, 300, (int(torch.randint(3, 20, (1,), generator=g)),), generator=g).tolist()
        mask = [1] * len(comp)
        if i % 2:                       # a merged episode: a tool result between two turns carries no loss
            mask[len(comp) // 3: 2 * len(comp) // 3] = [0] * (2 * len(comp) // 3 - len(comp) // 3)
        out.append(TurnSample(ctx, comp, [-1.0] * len(comp), advantage=(-1) ** i * 0.5, temperature=0.5 + 0.1 * i,
                              episode_id=f"e{i}", completion_mask=mask))
    return out


def test_selective_logprobs_equal_the_full_ones_at_every_loss_position():
    pol = tiny_policy()
    batch = collate(samples(), 0)
    want = full_logprobs(pol.model, batch) * (batch["loss_mask"] > 0)
    got = token_logprobs(pol.model, batch)
    assert torch.allclose(got, want, atol=1e-5) and got.abs().sum() > 0
    assert (got[batch["loss_mask"] == 0] == 0).all()


def test_entropies_at_the_loss_positions_equal_the_full_ones():
    pol = tiny_policy()
    batch = collate(samples(), 0)
    with torch.no_grad():
        logits = pol.model(input_ids=batch["input_ids"]).logits[:, :-1].float() / batch["temperature"].view(-1, 1, 1)
    logp = torch.log_softmax(logits, -1)
    want = torch.nn.functional.pad(-(logp.exp() * logp).sum(-1), (1, 0)) * (batch["loss_mask"] > 0)
    assert torch.allclose(token_entropies(pol.model, batch), want, atol=1e-5)


@pytest.mark.parametrize("kl_beta", [0.0, 0.1])
def test_loss_and_gradients_equal_todays_within_1e_5(kl_beta, monkeypatch):
    pol = tiny_policy(kl_beta=kl_beta)
    batch = collate(samples(), 0)
    with torch.no_grad():   # sampled log-probs near the policy's: ratios near 1, some clipped
        batch["old_logprobs"] = (full_logprobs(pol.model, batch) + 0.1 * torch.randn(batch["input_ids"].shape)) \
            * batch["loss_mask"]
    loss_full, g_full = loss_and_grads(pol, batch, full_logprobs, monkeypatch)
    loss_sel, g_sel = loss_and_grads(pol, batch, token_logprobs, monkeypatch)
    assert torch.allclose(loss_sel, loss_full, atol=1e-5)
    assert all(torch.allclose(g_sel[n], g_full[n], atol=1e-5) for n in g_full)
    assert sum(g.abs().sum() for g in g_sel.values()) > 0


def test_micro_batches_by_tokens_keep_order_and_cap():
    ss = samples(7)
    lens = [len(s.context_ids) + len(s.completion_ids) for s in ss]
    cut = micro_batches(ss, max_rows=4, max_tokens=max(lens) + 10)
    assert [s for b in cut for s in b] == ss
    for b in cut:
        width = max(len(s.context_ids) + len(s.completion_ids) for s in b)
        assert len(b) == 1 or len(b) * width <= max(lens) + 10
    assert [len(b) for b in micro_batches(ss, max_rows=3)] == [3, 3, 1]
    assert [len(b) for b in micro_batches(ss, max_rows=8, max_tokens=1)] == [1] * 7


def test_the_update_is_the_same_by_rows_by_tokens_and_with_checkpointing():
    """One update of the same samples: 8-row micro-batches, token-capped ones, and gradient checkpointing give
    the same adapter (the loss is normalised over the whole step, gradients accumulate to one optimizer step)."""
    states = []
    for kw in ({}, {"micro_batch_tokens": 60}, {"gradient_checkpointing": True, "micro_batch_size": 2},
               {"gradient_checkpointing": True, "share_prefix": True, "micro_batch_tokens": 90}):
        pol = tiny_policy(**kw)
        # SGD: the step is the gradient itself (Adam's first step is lr x its sign, which float noise can flip)
        pol.module._optimizer = torch.optim.SGD([p for p in pol.model.parameters() if p.requires_grad], lr=1.0)
        stats = pol.update(with_prefix(samples(6)))
        assert stats["samples"] == 6
        states.append(pol.trainable_state())
    for other in states[1:]:
        assert all(torch.allclose(other[n], states[0][n], atol=1e-5) for n in states[0])
    assert any(not torch.equal(states[0][n], tiny_policy().trainable_state()[n]) for n in states[0])


def with_prefix(ss: list[TurnSample], n: int = 30) -> list[TurnSample]:
    """The samples opening with the same ``n`` tokens (a step's system prompt and tool list)."""
    from dataclasses import replace

    head = torch.randint(1, 300, (n,), generator=torch.Generator().manual_seed(7)).tolist()
    return [replace(s, context_ids=head + s.context_ids) for s in ss]


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_shared_prefix_run_once_gives_the_same_logprobs_loss_and_gradients(checkpointing, monkeypatch):
    """``outer.share_prefix``: the rows' common opening runs once, its keys and values (with their gradient) read
    by every row; log-probs, entropies, loss and gradients equal one pass over the whole rows, with gradient
    checkpointing too (a recomputed layer must not append to the shared cache a second time)."""
    pol = tiny_policy(gradient_checkpointing=checkpointing)
    if checkpointing:
        pol.model.get_base_model().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ss = with_prefix(samples())
    whole, shared = collate(ss, 0), collate(ss, 0, share_prefix=True)
    assert int(shared["shared_prefix"]) == 30 + shared_length([s.context_ids for s in samples()])
    import agent_trainer.outer_loop.rl.logprobs as P

    runs, sharing = [], P._hidden_sharing_prefix
    monkeypatch.setattr(P, "_hidden_sharing_prefix", lambda *a: runs.append(a[-1]) or sharing(*a))
    pol.model.train()
    assert torch.allclose(token_logprobs(pol.model, shared), token_logprobs(pol.model, whole), atol=1e-5)
    assert runs == [int(shared["shared_prefix"])], "the shared pass ran, once"
    assert torch.allclose(token_entropies(pol.model, shared), token_entropies(pol.model, whole), atol=1e-5)
    with torch.no_grad():
        old = token_logprobs(pol.model, whole) * whole["loss_mask"]
    whole["old_logprobs"] = shared["old_logprobs"] = old
    loss_whole, g_whole = loss_and_grads(pol, whole, token_logprobs, monkeypatch)
    loss_shared, g_shared = loss_and_grads(pol, shared, token_logprobs, monkeypatch)
    assert torch.allclose(loss_shared, loss_whole, atol=1e-6)
    scale = max(g.abs().max() for g in g_whole.values())
    assert all(torch.allclose(g_shared[n], g_whole[n], atol=1e-5 * scale) for n in g_whole)
    prefix_only = [n for n in g_whole if "k_proj.lora_B" in n]   # reached through the prefix's keys too
    assert prefix_only and all(g_shared[n].abs().sum() > 0 for n in prefix_only)


def test_micro_batches_count_a_shared_prefix_once():
    ss = with_prefix(samples(4), n=100)
    longest = max(len(s.context_ids) + len(s.completion_ids) for s in ss)
    assert [len(b) for b in micro_batches(ss, max_rows=8, max_tokens=2 * longest)] == [2, 2]
    assert [len(b) for b in micro_batches(ss, max_rows=8, max_tokens=2 * longest, share_prefix=True)] == [4]
    assert collate(samples(1), 0, share_prefix=True)["shared_prefix"] == 0, "one row shares nothing"
