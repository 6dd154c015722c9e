"""The clipped objective on hand-made log-probs (no model): the clip, the KL term and the whole-step norms."""

import math

import torch

from agent_trainer.config import OuterConfig
from agent_trainer.outer_loop.rl.logprobs import collate
from agent_trainer.outer_loop.rl.objective import TurnSample, clipped_loss


def _batch(advantages, old):
    """One row per advantage: a 2-token context and one sampled token whose sampler log-prob is ``old[i]``."""
    return collate([TurnSample([1, 2], [3], [o], a) for a, o in zip(advantages, old)], pad_id=0)


def _new(values):
    new = torch.zeros(len(values), 3)
    new[:, 2] = torch.tensor(values)
    return new.requires_grad_()


def test_a_ratio_past_the_upper_clip_carries_no_gradient_and_one_inside_carries_the_advantage():
    cfg = OuterConfig(clip_eps=0.2, clip_eps_high=0.28, kl_beta=0.0)
    batch = _batch([1.0, 1.0, -1.0], [0.0, 0.0, 0.0])
    new = _new([math.log(1.5), math.log(1.1), math.log(1.1)])   # ratios 1.5 (clipped), 1.1, 1.1
    loss, stats = clipped_loss(new, batch, cfg)
    loss.backward()
    grad = new.grad[:, 2]
    assert grad[0] == 0.0, "A > 0 and the ratio over 1 + eps_high: clipped, no push further"
    assert torch.allclose(grad[1:], torch.tensor([-1.1 / 3, 1.1 / 3])), grad   # -A * ratio / tokens
    assert math.isclose(stats["clip_frac"], 1 / 3, rel_tol=1e-6) and stats["tokens"] == 3.0
    assert math.isclose(stats["loss"], -(1.28 + 1.1 - 1.1) / 3, rel_tol=1e-6)


def test_the_kl_term_is_the_k3_estimate_against_the_reference():
    cfg = OuterConfig(kl_beta=0.5)
    batch = _batch([0.0, 0.0], [-1.0, -1.0])
    new, ref = _new([-1.0, -2.0]), torch.zeros(2, 3)
    ref[:, 2] = torch.tensor([-1.0, -1.0])
    loss, stats = clipped_loss(new, batch, cfg, ref)
    k3 = math.exp(1.0) - 1.0 - 1.0     # delta = ref - new = 1 on the second row, 0 on the first
    assert math.isclose(stats["kl"], k3 / 2, rel_tol=1e-6)
    assert math.isclose(loss.item(), 0.5 * k3 / 2, rel_tol=1e-6)


def test_micro_batches_with_the_steps_norms_add_up_to_the_whole_batch():
    cfg = OuterConfig(kl_beta=0.0)
    adv, old, values = [0.7, -0.3, 0.1, -0.5], [-1.0, -2.0, -0.5, -1.5], [-0.9, -2.2, -0.4, -1.5]
    whole, _ = clipped_loss(_new(values), _batch(adv, old), cfg)
    parts = [clipped_loss(_new(values[i:i + 2]), _batch(adv[i:i + 2], old[i:i + 2]), cfg, norm=4.0, pg_norm=4.0)[0]
             for i in (0, 2)]
    assert torch.allclose(sum(parts), whole)
