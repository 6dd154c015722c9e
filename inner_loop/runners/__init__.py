"""TRL runners for inner jobs: GRPO, SFT and DPO, full or LoRA, with budget/divergence guards.

    >>> from inner_loop.runners import train
    >>> report = train(spec, rows, rewards, model_path, "job/output", max_steps=200, max_seconds=90)

A whole job (its stages, self-generated data, DPO pairs, the ``ran`` record) goes through
``inner_loop.runners.stages.run_stages``, which calls ``train`` once per stage.

Run them in the worker process (``python -m inner_loop.worker``), never in the harness: they
execute the job's reward code. ``inner_loop.job.run_job`` does that for you.
"""

from inner_loop.runners.callbacks import BudgetGuard, StepLog
from inner_loop.runners.config import lora_config, planned_steps, trl_config
from inner_loop.runners.train import (
    MODEL_DIR, TRAIN_LOG, TRL_CONFIG, TrainReport, build_trainer, save_checkpoint, train,
)

__all__ = [
    "BudgetGuard", "StepLog", "lora_config", "planned_steps", "trl_config", "TrainReport",
    "build_trainer", "save_checkpoint", "train", "TRAIN_LOG", "TRL_CONFIG", "MODEL_DIR",
]
