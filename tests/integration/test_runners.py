"""TRL runners in-process on a random-init tiny Qwen3: parameters move, LoRA leaves the base alone,
the effective TRL config carries every job hyperparameter, and a huge learning rate is caught.

    .venv/bin/pytest tests/integration/test_runners.py -q        (~30-60 s on 2 cores)
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, TrainerCallback

from agent_trainer.evaluation.families import get_family
from agent_trainer.inner_loop.spec.jobspec import JobSpec
from agent_trainer.inner_loop.train.train import TRAIN_LOG, TRL_CONFIG, train
from agent_trainer.inner_loop.train.config import trl_config


ROWS = [dict(ex.as_dict(), family="calc_chain") for ex in get_family("calc_chain").training_examples(seed=3, n=48)]


def checksum_reward(prompts, completions, **kwargs):
    """Dense and arbitrary: every group of a random model gets reward spread, so GRPO always has a gradient."""
    return [float(sum(map(ord, c)) % 7) for c in completions]


def _spec(algorithm: str, lora: bool, lr: float = 1e-2, steps: int = 2) -> JobSpec:
    return JobSpec.model_validate({
        "base_model": "tiny-s", "algorithm": algorithm, "peft": {"r": 4, "alpha": 8} if lora else None,
        "hyperparameters": {"learning_rate": lr, "batch_size": 8, "num_generations": 4, "max_completion_length": 4,
                            "max_steps": steps},
        "data": {"sources": [{"family": "calc_chain"}]},
        "reward": {"functions": [{"name": "exact_match"}]} if algorithm == "grpo" else None,
    })


class Snapshot(TrainerCallback):
    """Copies every parameter at the start of training and again at the end (the test hook)."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        self.before = {n: p.detach().clone() for n, p in model.named_parameters()}

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.after = {n: p.detach().clone() for n, p in model.named_parameters()}

    def changed(self, names) -> dict[str, bool]:
        return {n: not torch.equal(self.before[n], self.after[n]) for n in names}


@pytest.mark.parametrize("algorithm", ["grpo", "sft"])
def test_full_training_changes_every_parameter(base_dir, tmp_path, algorithm):
    snap = Snapshot()
    rewards = [("checksum", checksum_reward, 1.0)]
    report = train(_spec(algorithm, lora=False), ROWS, rewards, base_dir, tmp_path, max_steps=50,
                   callbacks=[snap])
    assert report.status == "ok" and report.steps == 2
    assert snap.trainable == set(snap.before), "full fine-tuning trains every parameter"
    unchanged = [n for n, moved in snap.changed(snap.trainable).items() if not moved]
    assert not unchanged, f"parameters not updated: {unchanged}"
    log = [json.loads(line) for line in (tmp_path / TRAIN_LOG).read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2] and all("loss" in r and "lr" in r and "seconds" in r for r in log)
    if algorithm == "grpo":
        assert all("reward" in r and "reward_std" in r for r in log)


@pytest.mark.parametrize("algorithm", ["grpo", "sft"])
def test_lora_changes_the_adapter_only_and_saves_a_merged_model(base_dir, tmp_path, algorithm):
    snap = Snapshot()
    report = train(_spec(algorithm, lora=True, steps=3), ROWS, [("checksum", checksum_reward, 1.0)], base_dir,
                   tmp_path, max_steps=50, callbacks=[snap])
    assert report.status == "ok"
    assert snap.trainable and all("lora_" in n for n in snap.trainable)
    assert all(snap.changed(snap.trainable).values()), "every adapter matrix moves (B first, then A)"
    frozen = set(snap.before) - snap.trainable
    assert frozen and not any(snap.changed(frozen).values()), "LoRA must leave the base weights unchanged"

    merged = AutoModelForCausalLM.from_pretrained(report.model_dir)
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    assert type(merged) is type(base) and not any("lora" in n for n, _ in merged.named_parameters())
    moved = [n for n, p in merged.named_parameters() if not torch.equal(p, base.state_dict()[n])]
    assert moved, "the merged checkpoint must carry the adapter's update"


def test_trl_config_carries_every_hyperparameter(tmp_path):
    spec = JobSpec.model_validate({
        "base_model": "tiny-s", "algorithm": "grpo", "seed": 7,
        "hyperparameters": {"learning_rate": 3e-4, "batch_size": 24, "num_generations": 6, "max_steps": 999,
                            "lr_scheduler": "cosine", "warmup_ratio": 0.1, "weight_decay": 0.01, "max_grad_norm": 0.5,
                            "max_completion_length": 9, "temperature": 0.7, "beta": 0.04, "loss_type": "dr_grpo",
                            "scale_rewards": "batch"},
        "data": {"sources": [{"family": "calc_chain"}]},
        "reward": {"functions": [{"name": "exact_match", "weight": 2.0}, {"name": "numeric_closeness"}]},
    })
    cfg = trl_config(spec, tmp_path, max_steps=40, reward_weights=[2.0, 1.0]).to_dict()
    expected = {"learning_rate": 3e-4, "per_device_train_batch_size": 24, "generation_batch_size": 24,
                "num_generations": 6, "max_steps": 40, "lr_scheduler_type": "cosine", "warmup_steps": 0.1,
                "weight_decay": 0.01, "max_grad_norm": 0.5, "max_completion_length": 9, "temperature": 0.7,
                "beta": 0.04, "loss_type": "dr_grpo", "scale_rewards": "batch", "reward_weights": [2.0, 1.0],
                "seed": 7, "use_cpu": True, "bf16": False, "gradient_checkpointing": False, "save_strategy": "no",
                "report_to": []}
    assert {k: cfg[k] for k in expected} == expected
    sft = trl_config(spec.model_copy(update={"algorithm": "sft", "reward": None}), tmp_path, max_steps=5).to_dict()
    assert sft["completion_only_loss"] is True and sft["per_device_train_batch_size"] == 24 and not sft["bf16"]


def test_huge_learning_rate_diverges_and_saves_nothing(base_dir, tmp_path):
    report = train(_spec("sft", lora=False, lr=1.0, steps=20), ROWS, [], base_dir, tmp_path, max_steps=50)
    assert report.status == "diverged" and report.steps < 20
    assert "learning_rate" in report.detail and report.model_dir is None
    assert not (tmp_path / "model").exists()
    assert json.loads((tmp_path / TRL_CONFIG).read_text())["learning_rate"] == 1.0


def test_compute_budget_stops_gracefully_at_a_counted_step_and_keeps_the_model(base_dir, tmp_path):
    report = train(_spec("sft", lora=False, steps=500), ROWS, [], base_dir, tmp_path, max_steps=500,
                   max_compute=1.0, step_compute=0.25)
    assert report.status == "timeout" and report.steps == 4, "4 steps of 0.25 s fit in 1 s, whatever the clock"
    assert "compute budget" in report.detail
    assert (tmp_path / "model" / "model.safetensors").is_file()


@pytest.mark.parametrize("max_length", [512, 14])
def test_batched_sft_tokenization_matches_trl_own_preparation(base_dir, tmp_path, max_length):
    """The harness tokenizes SFT rows in one batch and tells TRL to skip its per-row preparation; the
    trainer must see exactly what TRL would have built (ids, loss mask, truncation, dropped rows)."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTTrainer

    from agent_trainer.inner_loop.train.train import sft_dataset

    rows = [dict(ex.as_dict(), family=f) for f in ("calc_chain", "reverse_text", "triage")
            for ex in get_family(f).training_examples(seed=5, n=40)]
    rows.append({"prompt": "Q: 1+1=", "answer": "2<|im_end|>", "family": "calc_chain"})  # eos already there
    tok = AutoTokenizer.from_pretrained(base_dir)
    args = trl_config(_spec("sft", lora=False), tmp_path / "trl", max_steps=1)
    args.max_length, args.dataset_kwargs = max_length, None
    reference = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(base_dir), args=args, processing_class=tok,
                           train_dataset=Dataset.from_list([{"prompt": r["prompt"], "completion": r["answer"]}
                                                            for r in rows])).train_dataset
    ours = sft_dataset(rows, tok, max_length)
    assert ours["input_ids"] == reference["input_ids"]
    assert ours["labels"] == reference["labels"]
    if max_length == 14:  # long prompts fill the window: those rows have no loss left and are dropped
        assert 0 < len(ours) < len(rows)


def test_pissa_adapter_starts_as_the_base_model_and_holds_its_principal_part(base_dir):
    """``peft.init: pissa`` moves the weights' top singular directions into the adapter: the model
    computes exactly what the base did before training, and the adapter is not zero (PEFT's default B = 0)."""
    from peft import get_peft_model

    from agent_trainer.inner_loop.spec.jobspec import PeftSpec
    from agent_trainer.inner_loop.train.config import lora_config

    base = AutoModelForCausalLM.from_pretrained(base_dir)
    ids = torch.tensor([[5, 17, 33, 2, 40, 9]])
    with torch.no_grad():
        expected = base(input_ids=ids).logits
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir), lora_config(PeftSpec(r=4, init="pissa")))
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, expected, atol=1e-4)
    b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert b and all(p.abs().sum() > 0 for p in b)


def test_portable_pissa_starts_as_the_base_model_from_a_rounded_float64_svd(base_dir, monkeypatch):
    """Under the portable kernels PiSSA's adapter comes from a float64 SVD with fixed signs, rounded to 20 mantissa
    bits (``agent_trainer.inner_loop.train.pissa``): the model still computes what the base did, A and B keep only
    20 bits, and they are PEFT's adapter up to a sign per singular pair. With native kernels PEFT's init is kept."""
    from peft import get_peft_model

    from agent_trainer.inner_loop.spec.jobspec import PeftSpec
    from agent_trainer.inner_loop.train.config import lora_config
    from agent_trainer.inner_loop.train.pissa import PISSA_BITS, portable_pissa
    from agent_trainer.kernels import PORTABLE_KERNELS

    if torch.backends.cpu.get_cpu_capability() != "AVX2":
        pytest.skip("the portable kernels need torch at its AVX2 level in this process (started with "
                    "ATEN_CPU_CAPABILITY=avx2)")
    spec = PeftSpec(r=4, init="pissa")
    ids = torch.tensor([[5, 17, 33, 2, 40, 9]])
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(base_dir)(input_ids=ids).logits

    def adapter(kernels: dict):
        for k in PORTABLE_KERNELS:
            monkeypatch.delenv(k, raising=False)
        for k, v in kernels.items():
            monkeypatch.setenv(k, v)
        with portable_pissa(spec):
            model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir), lora_config(spec))
        with torch.no_grad():
            assert torch.allclose(model(input_ids=ids).logits, expected, atol=1e-4)
        return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}

    native, portable = adapter({}), adapter(PORTABLE_KERNELS)
    low_bits = (1 << (23 - PISSA_BITS)) - 1
    assert all(not (p.view(torch.int32) & low_bits).any() for p in portable.values()), "20 mantissa bits kept"
    assert any((p.view(torch.int32) & low_bits).any() for p in native.values()), "native: PEFT's own float32 SVD"
    for name, p in portable.items():   # the same adapter as PEFT's, but for a sign per pair and the rounding
        same = torch.isclose(p, native[name], atol=1e-4) | torch.isclose(p, -native[name], atol=1e-4)
        assert same.float().mean() > 0.99, name
