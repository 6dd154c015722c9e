"""JobSpec: the schema of ``job.yaml``, the training job an agent writes.

A job directory holds ``job.yaml`` and, optionally, ``data.jsonl`` (rows ``{"prompt", "answer"}``)
and ``reward.py`` (TRL reward callables ``f(prompts, completions, **kwargs) -> list[float | None]``).
This module checks the *shape* of a job only; ``inner_loop.validate`` adds the checks that need
the task spec, the files and a dry run.

Example (GRPO with LoRA on curated family data)::

    base_model: tiny-s
    algorithm: grpo
    peft: {r: 16, alpha: 32}
    hyperparameters: {learning_rate: 5.0e-4, batch_size: 64, num_generations: 8, max_steps: 75}
    data:
      sources: [{family: calc_chain, seed: 1, size: 2000}]
    reward:
      functions: [{name: numeric_closeness, weight: 1.0}, {name: exact_match, weight: 1.0}]
    seed: 0
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

JOB_FILE = "job.yaml"
DATA_FILE = "data.jsonl"
REWARD_FILE = "reward.py"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class PeftSpec(_Strict):
    """A LoRA adapter; omit ``peft`` (or set it to null) for full fine-tuning."""

    r: int = Field(16, ge=1, le=256, description="LoRA rank")
    alpha: float = Field(32, gt=0, le=1024, description="LoRA alpha (scale = alpha / r)")
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: str | list[str] = Field(
        "all-linear", description="'all-linear' or module names such as [q_proj, v_proj]"
    )


class Hyperparameters(_Strict):
    """Optimisation settings. GRPO-only fields are ignored by SFT and say so in validation."""

    learning_rate: float = Field(5e-4, gt=0, description="peak learning rate")
    batch_size: int = Field(32, ge=1, le=4096, description="SFT: sequences per step; GRPO: completions per step")
    max_steps: int = Field(100, ge=1, le=100_000, description="optimizer steps (the task budget caps it)")
    epochs: float | None = Field(None, gt=0, le=1000, description="alternative to max_steps; max_steps wins")
    lr_scheduler: Literal["constant", "linear", "cosine", "constant_with_warmup"] = "constant"
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    max_grad_norm: float = Field(1.0, gt=0)
    # GRPO
    num_generations: int = Field(8, ge=1, le=256, description="GRPO completions per prompt (>= 2)")
    max_completion_length: int = Field(12, ge=1, le=2048, description="GRPO: tokens generated per completion")
    temperature: float = Field(1.0, gt=0, le=5.0, description="GRPO sampling temperature")
    beta: float = Field(0.0, ge=0.0, le=10.0, description="GRPO KL coefficient (0 = no reference model)")
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo"] = Field("dapo", description="TRL GRPO loss type")
    scale_rewards: Literal["group", "batch", "none"] = "group"


class DataSource(_Strict):
    """Items from a task family's agent-facing generator."""

    family: str
    seed: int = Field(0, ge=0, description="generator seed, any integer in [0, 1000000)")
    size: int = Field(1000, ge=1, le=100_000)
    weight: float = Field(1.0, gt=0, description="share in the mix (normalised over sources)")


class DataSpec(_Strict):
    """Training data: library sources, an agent-written ``data.jsonl``, or both (concatenated)."""

    sources: list[DataSource] = Field(default_factory=list)
    file: str | None = Field(None, description="a JSONL file in the job folder with prompt/answer rows")

    @model_validator(mode="after")
    def _non_empty(self) -> "DataSpec":
        if not self.sources and not self.file:
            raise ValueError("data needs at least one library source or a file (e.g. file: data.jsonl)")
        return self


class RewardFunction(_Strict):
    """One reward: a library function by name, or a function defined in the job's reward file."""

    name: str
    weight: float = 1.0
    source: Literal["library", "file"] = "library"


class RewardSpec(_Strict):
    """GRPO rewards, summed with weights. Each is a TRL reward callable."""

    functions: list[RewardFunction] = Field(default_factory=list, min_length=1)
    file: str = Field(REWARD_FILE, description="the job's Python file for functions with source: file")


class JobSpec(_Strict):
    """The whole ``job.yaml``."""

    base_model: str = Field(description="one of the task's allowed base models, e.g. tiny-s")
    algorithm: Literal["grpo", "sft"]
    peft: PeftSpec | None = Field(None, description="LoRA settings; null for full fine-tuning")
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    data: DataSpec
    reward: RewardSpec | None = Field(None, description="required for grpo, not used by sft")
    seed: int = Field(0, ge=0, le=2**31 - 1)

    @model_validator(mode="after")
    def _combinations(self) -> "JobSpec":
        hp = self.hyperparameters
        if self.algorithm == "grpo":
            if self.reward is None:
                raise ValueError("algorithm grpo needs a reward: e.g. reward: {functions: [{name: exact_match}]}")
            if hp.num_generations < 2:
                raise ValueError(
                    "GRPO needs at least 2 generations per prompt (hyperparameters.num_generations >= 2): "
                    "advantages compare completions of the same prompt"
                )
            if hp.batch_size % hp.num_generations:
                raise ValueError(
                    f"hyperparameters.batch_size ({hp.batch_size}) must be divisible by num_generations "
                    f"({hp.num_generations}) for GRPO; e.g. batch_size: {hp.num_generations * max(1, hp.batch_size // hp.num_generations)}"
                )
        return self

    @property
    def uses_agent_code(self) -> bool:
        """True when the job carries agent-written code (a reward file)."""
        return bool(self.reward and any(f.source == "file" for f in self.reward.functions))

    @property
    def uses_agent_data(self) -> bool:
        """True when the job carries agent-written data."""
        return self.data.file is not None

    def strategy_algorithm(self) -> str:
        """Short label of the algorithm as run, e.g. ``grpo+lora`` or ``sft+full``."""
        return f"{self.algorithm}+{'lora' if self.peft else 'full'}"


def job_path(job_dir: str | Path) -> Path:
    """Path of ``job.yaml`` inside a job directory."""
    return Path(job_dir) / JOB_FILE
