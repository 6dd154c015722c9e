"""JobSpec: the schema of ``job.yaml``, the training job an agent writes.

A job directory holds ``job.yaml`` and, optionally, ``data.jsonl`` (rows ``{"prompt", "answer"}``)
and ``reward.py`` (TRL reward callables ``f(prompts, completions, **kwargs) -> list[float | None]``).
This module checks the *shape* of a job only; ``inner_loop.validate`` adds the checks that need
the task spec, the files and a dry run.

    >>> from inner_loop.jobspec import load_job
    >>> spec = load_job("examples/jobs/grpo_lora")      # JobSpecError with one line per problem

Example (GRPO with LoRA on curated family data)::

    base_model: tiny-s
    algorithm: grpo
    peft: {r: 16, alpha: 32}
    hyperparameters: {learning_rate: 2.0e-3, batch_size: 256, num_generations: 8, max_steps: 120}
    data:
      sources: [{family: calc_chain, seed: 1, size: 2000}]
    reward:
      functions: [{name: numeric_closeness, weight: 1.0}, {name: exact_match, weight: 1.0}]
    seed: 0

Cross-field errors raised by validators start with ``[field.path]`` (relative to the model that
raises them) so that ``describe_errors`` can point at the field an agent has to change.
"""

from __future__ import annotations

import math
import re
from pathlib import Path, PurePosixPath
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from evaluation.families import FAMILIES, MAX_AGENT_SEED
from inner_loop.rewards import LIBRARY

JOB_FILE = "job.yaml"
DATA_FILE = "data.jsonl"
REWARD_FILE = "reward.py"
_FIELD_PREFIX = re.compile(r"^(?:Value error, )?\[([\w.]+)\] ")


class JobSpecError(ValueError):
    """A job that cannot be parsed; the message has one ``field: problem`` line per error."""


class _Strict(BaseModel):
    # Unknown keys fail (a typo must not silently become a default); NaN/inf are never meant.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def _job_relative(value: str, what: str) -> str:
    """A file name inside the job folder: relative, no '..' (the job may read only its own folder)."""
    p = PurePosixPath(value)
    if not value.strip() or p.is_absolute() or ".." in p.parts or "\\" in value:
        raise ValueError(f"{what} must be a file name inside the job folder, got {value!r}; "
                         f"use a plain name like {'reward.py' if what.startswith('reward') else 'data.jsonl'}")
    return value


class PeftSpec(_Strict):
    """A LoRA adapter; omit ``peft`` (or set it to null) for full fine-tuning."""

    r: int = Field(16, ge=1, le=256, description="LoRA rank")
    alpha: float = Field(32, gt=0, le=1024, description="LoRA alpha (scale = alpha / r)")
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: str | list[str] = Field(
        "all-linear", description="'all-linear' or module names such as [q_proj, v_proj]"
    )


class Hyperparameters(_Strict):
    """Optimisation settings. GRPO-only fields are ignored by SFT (validation warns when set)."""

    learning_rate: float = Field(5e-4, gt=0, le=1.0, description="peak learning rate")
    batch_size: int = Field(32, ge=1, le=4096, description="SFT: sequences per step; GRPO: completions per step")
    max_steps: int = Field(100, ge=1, le=100_000, description="optimizer steps (the task budget caps it)")
    epochs: float | None = Field(None, gt=0, le=1000,
                                 description="passes over the data, used only when max_steps is not given")
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


GRPO_ONLY = ("num_generations", "max_completion_length", "temperature", "beta", "loss_type", "scale_rewards")


class DataSource(_Strict):
    """Items from a task family's agent-facing generator.

    ``size`` distinct draws form the source's pool; ``weight`` is its share of the mixed stream,
    whose length is the sum of all sizes (a pool is repeated or subsampled to fill its share).
    """

    family: str
    seed: int = Field(0, ge=0, lt=MAX_AGENT_SEED, description=f"generator seed in [0, {MAX_AGENT_SEED})")
    size: int = Field(1000, ge=1, le=100_000, description="items drawn from the generator")
    weight: float = Field(1.0, gt=0, le=1000, description="share in the mix (normalised over sources)")

    @field_validator("family")
    @classmethod
    def _known_family(cls, v: str) -> str:
        if v not in FAMILIES:
            raise ValueError(f"unknown family {v!r}; known families: {', '.join(sorted(FAMILIES))}")
        return v


class DataSpec(_Strict):
    """Training data: library sources, an agent-written ``data.jsonl``, or both (concatenated)."""

    sources: list[DataSource] = Field(default_factory=list, max_length=16)
    file: str | None = Field(None, description="a JSONL file in the job folder with prompt/answer rows")

    @field_validator("file")
    @classmethod
    def _inside_job(cls, v: str | None) -> str | None:
        return None if v is None else _job_relative(v, "data.file")

    @model_validator(mode="after")
    def _non_empty(self) -> "DataSpec":
        if not self.sources and not self.file:
            raise ValueError("[sources] data needs at least one library source or a file; e.g. "
                             "sources: [{family: calc_chain, seed: 1, size: 2000}] or file: data.jsonl")
        return self


class RewardFunction(_Strict):
    """One reward: a library function by name, or a function defined in the job's reward file."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="a Python identifier")
    weight: float = Field(1.0, ge=-100, le=100)
    source: Literal["library", "file"] = "library"

    @model_validator(mode="after")
    def _known(self) -> "RewardFunction":
        if self.source == "library" and self.name not in LIBRARY:
            raise ValueError(f"[name] unknown library reward {self.name!r}; known: {', '.join(LIBRARY)} "
                             "(or set source: file for a function in reward.py)")
        return self


class RewardSpec(_Strict):
    """GRPO rewards, summed with weights. Each is a TRL reward callable."""

    functions: list[RewardFunction] = Field(min_length=1, max_length=16)
    file: str = Field(REWARD_FILE, description="the job's Python file for functions with source: file")

    @field_validator("file")
    @classmethod
    def _inside_job(cls, v: str) -> str:
        v = _job_relative(v, "reward.file")
        if not v.endswith(".py"):
            raise ValueError(f"reward.file must be a Python file, got {v!r}; name it like reward.py")
        return v

    @model_validator(mode="after")
    def _distinct(self) -> "RewardSpec":
        seen: set[str] = set()
        for i, f in enumerate(self.functions):
            if f.name in seen:
                raise ValueError(f"[functions.{i}.name] reward {f.name!r} is listed twice; "
                                 "keep one entry and add up the weights")
            seen.add(f.name)
        if all(f.weight == 0 for f in self.functions):
            raise ValueError("[functions] every reward weight is 0, so the reward is constant; give one a weight")
        return self


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
                raise ValueError("[reward] algorithm grpo needs a reward; e.g. reward: {functions: [{name: exact_match}]}")
            if hp.num_generations < 2:
                raise ValueError(
                    "[hyperparameters.num_generations] GRPO needs at least 2 generations per prompt (advantages "
                    "compare completions of the same prompt); use 4 or 8"
                )
            if hp.batch_size % hp.num_generations:
                fixed = hp.num_generations * max(1, hp.batch_size // hp.num_generations)
                raise ValueError(
                    f"[hyperparameters.batch_size] batch_size ({hp.batch_size}) must be divisible by "
                    f"num_generations ({hp.num_generations}) for GRPO; e.g. batch_size: {fixed}"
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

    def rows_per_step(self) -> int:
        """Dataset rows consumed per optimizer step: SFT sequences, GRPO prompts."""
        hp = self.hyperparameters
        return hp.batch_size // hp.num_generations if self.algorithm == "grpo" else hp.batch_size

    def effective_max_steps(self, n_rows: int) -> int:
        """Steps the runner trains: ``max_steps`` if given, else ``epochs`` over ``n_rows``, else the default."""
        hp = self.hyperparameters
        if "max_steps" not in hp.model_fields_set and hp.epochs is not None:
            return max(1, min(100_000, math.ceil(hp.epochs * n_rows / self.rows_per_step())))
        return hp.max_steps


def job_path(job_dir: str | Path) -> Path:
    """Path of ``job.yaml`` inside a job directory."""
    return Path(job_dir) / JOB_FILE


def error_field(err: dict) -> tuple[str, str]:
    """``(dotted field path, message)`` of one pydantic error, using a validator's ``[field]`` prefix."""
    loc = [str(x) for x in err.get("loc", ())]
    msg = str(err.get("msg", ""))
    m = _FIELD_PREFIX.match(msg)
    if m:
        loc.append(m.group(1))
        msg = msg[m.end():]
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return ".".join(loc) or "<root>", msg


def describe_errors(e: ValidationError) -> list[tuple[str, str]]:
    """All errors of a failed JobSpec validation as ``(field, message)`` pairs."""
    return [error_field(err) for err in e.errors()]


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (list, dict)):
                continue  # unhashable: the base class reports it
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (the first one would be lost; merge them)", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_job_yaml(path: str | Path) -> object:
    """Parse a job.yaml safely; raises ``JobSpecError`` (a ValueError) with the line for bad YAML."""
    path = Path(path)
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 (safe loader)
    except UnicodeDecodeError:
        raise JobSpecError(f"{path.name} is not UTF-8 text") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = " ".join(filter(None, [getattr(e, "context", None), getattr(e, "problem", None)])) or str(e)
        raise JobSpecError(f"{path.name}{where} is not valid YAML: {what}") from None


def load_job(job_dir: str | Path) -> JobSpec:
    """Read and validate ``job.yaml``; raises ``JobSpecError`` (one line per problem) on bad input."""
    path = job_path(job_dir)
    if not path.is_file():
        raise JobSpecError(f"{path} not found; a job folder needs a {JOB_FILE}")
    raw = read_job_yaml(path)
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as e:
        lines = [f"{field}: {msg}" for field, msg in describe_errors(e)]
        raise JobSpecError(f"{path} is invalid:\n" + "\n".join(lines)) from None
