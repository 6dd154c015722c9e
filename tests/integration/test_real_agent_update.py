"""The lean update on a real agent (SmolLM2-135M-Instruct): log-probs at the loss positions only give the loss and
gradients of the full-vocabulary log-softmax within 1e-5, with gradient checkpointing on; with the rows' shared
opening run once (``outer.share_prefix``), the same loss and gradients."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers.logprobs import full_logprobs, loss_and_grads
from helpers.updates import plain_update

from agent_trainer.outer_loop.rl.logprobs import collate, token_logprobs
from agent_trainer.outer_loop.rl.objective import TurnSample
from agent_trainer.outer_loop.rl.policy import AgentPolicy

pytestmark = pytest.mark.slow


def test_selective_logprobs_on_smollm2_give_the_same_loss_and_gradients(smollm2, monkeypatch):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        policy = AgentPolicy.from_pretrained(smollm2, plain_update(lora_r=4, lora_alpha=8, kl_beta=0.05,
                                                                   gradient_checkpointing=True), seed=0)
        for name, p in policy.model.named_parameters():   # a LoRA that does something (B starts at 0)
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
        g = torch.Generator().manual_seed(0)
        samples = []
        for i, (n_ctx, n_comp) in enumerate(((90, 30), (60, 24))):
            ctx = torch.randint(100, 40000, (n_ctx,), generator=g).tolist()
            comp = torch.randint(100, 40000, (n_comp,), generator=g).tolist()
            mask = [1] * n_comp
            mask[8:14] = [0] * 6                            # a tool result between two turns: no loss there
            samples.append(TurnSample(ctx, comp, [-5.0] * n_comp, advantage=0.7 if i else -0.7, temperature=0.7,
                                      completion_mask=mask))
        batch = collate(samples, 0)
        with torch.no_grad():
            batch["old_logprobs"] = full_logprobs(policy.model, batch) * batch["loss_mask"]
        loss_full, g_full = loss_and_grads(policy, batch, full_logprobs, monkeypatch)
        loss_sel, g_sel = loss_and_grads(policy, batch, token_logprobs, monkeypatch)   # the project's, as imported
        # outer.share_prefix: rows opening alike (a step's system prompt) run that opening once
        head = torch.randint(100, 40000, (64,), generator=g).tolist()
        opened = [replace(s, context_ids=head + s.context_ids) for s in samples]
        whole, shared = collate(opened, 0), collate(opened, 0, share_prefix=True)
        whole["old_logprobs"] = shared["old_logprobs"] = torch.zeros_like(whole["loss_mask"]) - 5.0
        loss_whole, g_whole = loss_and_grads(policy, whole, token_logprobs, monkeypatch)
        loss_shared, g_shared = loss_and_grads(policy, shared, token_logprobs, monkeypatch)
    finally:
        torch.set_num_threads(before)
    assert torch.allclose(loss_sel, loss_full, atol=1e-5)
    worst = max((g_sel[n] - g_full[n]).abs().max().item() for n in g_full)
    assert worst <= 1e-5, f"largest gradient difference {worst:.2e}"
    assert sum(v.abs().sum().item() for v in g_sel.values()) > 0
    assert int(shared["shared_prefix"]) == 64 and torch.allclose(loss_shared, loss_whole, atol=1e-5)
    scale = max(v.abs().max().item() for v in g_whole.values())
    worst = max((g_shared[n] - g_whole[n]).abs().max().item() for n in g_whole)
    # Float32 sums in another order through 30 layers: 1e-5 of the largest gradient on AVX2, 5.2e-5 on AVX-512.
    assert worst <= 1e-4 * scale, f"largest gradient difference with the prefix shared {worst:.2e} (of {scale:.2e})"

