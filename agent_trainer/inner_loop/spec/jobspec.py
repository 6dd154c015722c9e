"""JobSpec: the schema of ``job.yaml``, the training job an agent writes.

    spec = load_job("examples/jobs/grpo_lora")      # JobSpecError with one line per problem

Only the *shape* of a job is checked here; ``agent_trainer.inner_loop.spec.validate`` adds the checks that need the
task, the files and a dry run. Example jobs and the field rules: docs/jobs.md, "The job folder" and
"Strategy space".
"""

from __future__ import annotations

import math
import re
from pathlib import Path, PurePosixPath
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from agent_trainer.evaluation.families import FAMILIES, MAX_AGENT_SEED
from agent_trainer.inner_loop.spec.jobfiles import MAX_JOB_YAML_BYTES
from agent_trainer.inner_loop.spec.jobfiles import REWARD_FILE as REWARD_FILE_NAME
from agent_trainer.inner_loop.train.rewards import LIBRARY

JOB_FILE = "job.yaml"
DATA_FILE = "data.jsonl"
REWARD_FILE = "reward.py"
ALGORITHMS = ("grpo", "sft", "dpo")
Algorithm = Literal["grpo", "sft", "dpo"]
DPO_DEFAULT_BETA = 0.1
MAX_STAGES = 4
# Rows a job may build, over its sources, data files and stages (a stage sharing the job's data counts it once):
# the harness builds, checks and prices them before anything is charged, so their number must be bounded.
MAX_JOB_ROWS = 100_000
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
    init: Literal["default", "gaussian", "pissa", "olora"] = Field(
        "default",
        description="adapter initialisation (PEFT init_lora_weights): default (B = 0), gaussian, or pissa/olora, "
                    "which move the weights' principal part into the adapter (learns like full fine-tuning; "
                    "the base under the adapter is then a residual, so not for dpo or grpo with beta > 0)")


class Hyperparameters(_Strict):
    """Optimisation settings. GRPO-only fields are ignored by SFT (validation warns when set)."""

    learning_rate: float = Field(5e-4, gt=0, le=1.0, description="peak learning rate")
    batch_size: int = Field(32, ge=1, le=4096,
                            description="SFT: sequences per step; GRPO: completions per step; DPO: pairs per step")
    max_steps: int = Field(100, ge=1, le=100_000, description="optimizer steps (the task budget caps it)")
    epochs: float | None = Field(None, gt=0, le=1000,
                                 description="passes over the data, used only when max_steps is not given")
    lr_scheduler: Literal["constant", "linear", "cosine", "constant_with_warmup"] = "constant"
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    max_grad_norm: float = Field(1.0, gt=0)
    # GRPO
    num_generations: int = Field(8, ge=1, le=256,
                                 description="GRPO completions per prompt (>= 2); DPO: samples ranked per prompt")
    max_completion_length: int = Field(12, ge=1, le=2048, description="GRPO/DPO: tokens generated per completion")
    temperature: float = Field(1.0, gt=0, le=5.0, description="GRPO/DPO sampling temperature")
    beta: float = Field(0.0, ge=0.0, le=10.0, description="GRPO KL coefficient (0 = no reference model); DPO: > 0, "
                        f"{DPO_DEFAULT_BETA} if unset")
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo"] = Field("dapo", description="TRL GRPO loss type")
    scale_rewards: Literal["group", "batch", "none"] = "group"


GRPO_ONLY = ("num_generations", "max_completion_length", "temperature", "beta", "loss_type", "scale_rewards")
# DPO samples its pairs with these GRPO fields; the others do not apply to it.
DPO_IGNORED = ("loss_type", "scale_rewards")


class SelfGenerated(_Strict):
    """Rejection sampling: the model being trained answers the source's prompts; the reward decides what is kept."""

    samples_per_prompt: int = Field(4, ge=1, le=64)
    temperature: float = Field(1.0, gt=0, le=5.0)
    max_completion_length: int = Field(8, ge=1, le=256)
    min_reward: float = Field(1.0, ge=-1000, le=1000,
                              description="keep samples scoring at least this (the job's reward, else the family's: "
                                          "1.0 = correct)")


class DataSource(_Strict):
    """Items from a task family's agent-facing generator.

    ``size`` distinct draws form the source's pool; ``weight`` is its share of the mixed stream,
    whose length is the sum of all sizes (a pool is repeated or subsampled to fill its share).
    With ``self_generated`` the ``size`` items are prompts only: the pool is the model's own
    accepted samples (sft only).
    """

    family: str = Field(description="the family whose generator draws the items",
                        json_schema_extra={"shown_default": "the task's family"})
    seed: int = Field(0, ge=0, lt=MAX_AGENT_SEED, description=f"generator seed in [0, {MAX_AGENT_SEED})")
    size: int = Field(1000, ge=1, le=100_000, description="items drawn from the generator")
    weight: float = Field(1.0, gt=0, le=1000, description="share in the mix (normalised over sources)")
    self_generated: SelfGenerated | None = Field(
        None, description="sft only: train on the model's own answers that the reward accepts (true: defaults)")

    @model_validator(mode="before")
    @classmethod
    def _task_family(cls, data, info: ValidationInfo):
        # A source without ``family`` is the task's own: a job that says "train on the task's data" reads the
        # same for every task (the task comes in as the validation context, see ``load_job``).
        if isinstance(data, dict) and "family" not in data:
            family = (info.context or {}).get("task_family")
            if not family:
                raise ValueError("[family] family missing and no task to take it from; "
                                 "give one, e.g. family: calc_chain")
            data = {**data, "family": family}
        return data

    @field_validator("family")
    @classmethod
    def _known_family(cls, v: str) -> str:
        if v not in FAMILIES:
            raise ValueError(f"unknown family {v!r}; known families: {', '.join(sorted(FAMILIES))}")
        return v

    @field_validator("self_generated", mode="before")
    @classmethod
    def _flag(cls, v):
        # `self_generated: true` means "with the defaults"; false means curated.
        if v is True:
            return {}
        return None if v is False else v


class DataSpec(_Strict):
    """Training data: library sources, an agent-written ``data.jsonl``, or both (concatenated)."""

    sources: list[DataSource] = Field(default_factory=list, max_length=16)
    file: str | None = Field(None, description="a JSONL file in the job folder with prompt/answer rows "
                                                "(dpo: and chosen/rejected)")

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
        if not REWARD_FILE_NAME.match(v):
            raise ValueError(f"reward.file must be named reward*.py at the top of the job folder, got {v!r}; "
                             "name it reward.py (or e.g. reward_sft.py)")
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


def _check_stage(algorithm: str, hp: Hyperparameters, data: DataSpec, reward: "RewardSpec | None", at: str,
                 data_at: str, peft: PeftSpec | None = None) -> None:
    """Cross-field rules of one stage; ``at`` prefixes the stage's own fields, ``data_at`` its data's."""
    # PiSSA/OLoRA subtract the adapter's starting value from the base weights: with the adapter switched
    # off (TRL's reference model for LoRA) the model is that residual, not the starting model.
    has_reference = algorithm == "dpo" or (algorithm == "grpo" and hp.beta > 0)
    if peft is not None and peft.init in ("pissa", "olora") and has_reference:
        why = "dpo" if algorithm == "dpo" else f"grpo with beta {hp.beta:g}"
        raise ValueError(f"[{at}peft.init] {peft.init} moves the weights' principal part into the adapter, so the "
                         f"reference model of {why} (the base with the adapter off) would not be the starting model; "
                         "use init: default" + (" or beta: 0" if algorithm == "grpo" else ""))
    if algorithm == "grpo":
        if reward is None:
            raise ValueError(f"[{at}reward] algorithm grpo needs a reward; "
                             "e.g. reward: {functions: [{name: exact_match}]}")
        if hp.num_generations < 2:
            raise ValueError(
                f"[{at}hyperparameters.num_generations] GRPO needs at least 2 generations per prompt (advantages "
                "compare completions of the same prompt); use 4 or 8"
            )
        if hp.batch_size % hp.num_generations:
            fixed = hp.num_generations * max(1, hp.batch_size // hp.num_generations)
            raise ValueError(
                f"[{at}hyperparameters.batch_size] batch_size ({hp.batch_size}) must be divisible by "
                f"num_generations ({hp.num_generations}) for GRPO; e.g. batch_size: {fixed}"
            )
    if algorithm == "dpo":
        if hp.num_generations < 2:
            raise ValueError(f"[{at}hyperparameters.num_generations] DPO ranks num_generations samples per prompt into "
                             "a (best, worst) pair, so it needs at least 2; use 4 or 8")
        if "beta" in hp.model_fields_set and hp.beta == 0:
            raise ValueError(f"[{at}hyperparameters.beta] DPO needs beta > 0 (it scales the preference margin); "
                             f"use {DPO_DEFAULT_BETA} or leave beta out")
    if algorithm != "sft":
        for j, src in enumerate(data.sources):
            if src.self_generated is not None:
                why = ("grpo samples and scores its own completions" if algorithm == "grpo"
                       else "dpo builds its own pairs from the model's samples of the sources' prompts")
                raise ValueError(f"[{data_at}sources.{j}.self_generated] self_generated makes SFT data, but {why}; "
                                 "remove self_generated, or use algorithm: sft")


class StageSpec(_Strict):
    """One stage of a multi-stage job: it trains the model the previous stage saved (the first: the base model)."""

    algorithm: Algorithm
    peft: PeftSpec | None = Field(None, description="LoRA settings; null for full fine-tuning")
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    data: DataSpec | None = Field(None, description="default: the job's data")
    reward: RewardSpec | None = Field(None, description="default: the job's reward")
    budget_share: float = Field(1.0, gt=0, le=100, description="relative share of the training time")


class JobSpec(_Strict):
    """The whole ``job.yaml``: one training run (``algorithm``...) or several in sequence (``stages``)."""

    base_model: str = Field(description="one of the task's allowed base models, e.g. tiny-s")
    algorithm: Algorithm | None = Field(None, description="required unless stages is given")
    peft: PeftSpec | None = Field(None, description="LoRA settings; null for full fine-tuning")
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    data: DataSpec | None = Field(None, description="required unless each stage has data")
    reward: RewardSpec | None = Field(None, description="required for grpo; ranks dpo/self_generated samples "
                                                        "(default: the family's)")
    seed: int = Field(0, ge=0, le=2**31 - 1)
    stages: list[StageSpec] | None = Field(
        None, min_length=1, max_length=MAX_STAGES,
        description="trainings in sequence, each from the previous model, e.g. [{algorithm: sft}, {algorithm: grpo}]; "
                    "then no top-level algorithm/peft/hyperparameters")

    @model_validator(mode="after")
    def _combinations(self) -> "JobSpec":
        if self.stages is None:
            if self.algorithm is None:
                raise ValueError("[algorithm] Field required: grpo, sft or dpo; e.g. algorithm: sft "
                                 "(or a list of stages: [{algorithm: sft}, {algorithm: grpo}])")
            if self.data is None:
                raise ValueError("[data] Field required; "
                                 "e.g. data: {sources: [{family: calc_chain, seed: 1, size: 2000}]}")
            _check_stage(self.algorithm, self.hyperparameters, self.data, self.reward, "", "data.", self.peft)
            return self._bounded_data()
        top = [k for k in ("algorithm", "peft", "hyperparameters") if getattr(self, k) is not None
               and (k != "hyperparameters" or k in self.model_fields_set)]
        if top:
            raise ValueError(f"[{top[0]}] a job with stages sets {', '.join(top)} inside each stage; move "
                             f"{'it' if len(top) == 1 else 'them'} into the stages")
        for i, st in enumerate(self.stages):
            data = st.data or self.data
            if data is None:
                raise ValueError(f"[stages.{i}.data] stage {i + 1} has no data; give it data: or put data: at the "
                                 "top level for every stage")
            _check_stage(st.algorithm, st.hyperparameters, data, st.reward or self.reward, f"stages.{i}.",
                         f"stages.{i}.data." if st.data else "data.", st.peft)
        return self._bounded_data()

    def _bounded_data(self) -> "JobSpec":
        """At most ``MAX_JOB_ROWS`` library items over the job's distinct data (a data file's rows are counted
        when it is read: ``agent_trainer.inner_loop.spec.validate``)."""
        datas = {id(d): (at, d) for at, d in ([("data.", self.data)] if self.stages is None else
                                              [(f"stages.{i}.data." if st.data else "data.", st.data or self.data)
                                               for i, st in enumerate(self.stages)])}
        total = sum(src.size for _, d in datas.values() for src in d.sources)
        if total > MAX_JOB_ROWS:
            at = max(datas.values(), key=lambda x: sum(src.size for src in x[1].sources))[0]
            raise ValueError(f"[{at}sources] the job draws {total:,} items from the library, more than the "
                             f"{MAX_JOB_ROWS:,} a job may draw over its sources and stages; lower size (a step uses "
                             "batch_size rows, and epochs repeat them)")
        return self

    # --- the job as run: a list of single-stage views -------------------------------------------

    def stage_specs(self) -> list["JobSpec"]:
        """The job as single-stage JobSpecs, in order (a single-stage job is its own only stage).

        A stage's ``data`` and ``reward`` default to the job's; ``base_model`` and ``seed`` are the job's.
        """
        if self.stages is None:
            return [self]
        return [JobSpec.model_construct(base_model=self.base_model, algorithm=st.algorithm, peft=st.peft,
                                        hyperparameters=st.hyperparameters, data=st.data or self.data,
                                        reward=st.reward or self.reward, seed=self.seed, stages=None)
                for st in self.stages]

    def budget_shares(self) -> list[float]:
        """Relative share of the training time per stage (``[1.0]`` for a single-stage job)."""
        return [st.budget_share for st in self.stages] if self.stages else [1.0]

    @property
    def uses_agent_code(self) -> bool:
        """True when the job carries agent-written code (a reward file)."""
        return any(s.reward and any(f.source == "file" for f in s.reward.functions) for s in self.stage_specs())

    @property
    def uses_agent_data(self) -> bool:
        """True when the job carries agent-written data."""
        return any(s.data.file is not None for s in self.stage_specs())

    def agent_files(self) -> list[str]:
        """Names of the job's own files its stages use: data files, then reward files, each once."""
        views = self.stage_specs()
        names = [s.data.file for s in views if s.data.file]
        names += [s.reward.file for s in views if s.reward and any(f.source == "file" for f in s.reward.functions)]
        return list(dict.fromkeys(names))

    def strategy_algorithm(self) -> str:
        """Short label of the algorithm as run, e.g. ``grpo+lora``, ``sft+full`` or ``sft+full>grpo+lora`` (stages)."""
        return ">".join(f"{s.algorithm}+{'lora' if s.peft else 'full'}" for s in self.stage_specs())

    def rows_per_step(self) -> int:
        """Dataset rows consumed per optimizer step: SFT sequences, GRPO prompts, DPO pairs (of a single stage)."""
        hp = self.hyperparameters
        return hp.batch_size // hp.num_generations if self.algorithm == "grpo" else hp.batch_size

    def effective_max_steps(self, n_rows: int) -> int:
        """Steps the runner trains: ``max_steps`` if given, else ``epochs`` over ``n_rows``, else the default."""
        hp = self.hyperparameters
        if "max_steps" not in hp.model_fields_set and hp.epochs is not None:
            return max(1, min(100_000, math.ceil(hp.epochs * n_rows / self.rows_per_step())))
        return hp.max_steps

    def dpo_beta(self) -> float:
        """DPO's beta: the job's when set, else ``DPO_DEFAULT_BETA`` (GRPO's default 0 means no KL)."""
        hp = self.hyperparameters
        return hp.beta if "beta" in hp.model_fields_set else DPO_DEFAULT_BETA


def data_source_of(spec: JobSpec) -> str:
    """The data source a single-stage spec asks for: curated, self_generated, agent or mixed.

    dpo: its pairs are the model's samples of the sources' prompts (self_generated) and the
    agent's own pairs in ``data.file`` (agent). sft/grpo: reference answers of library sources
    (curated), ``self_generated`` sources, the agent's ``data.file`` (agent).
    """
    if spec.algorithm == "dpo":
        kinds = {"self_generated"} if spec.data.sources else set()
    else:
        kinds = {"self_generated" if s.self_generated is not None else "curated" for s in spec.data.sources}
    if spec.data.file:
        kinds.add("agent")
    return kinds.pop() if len(kinds) == 1 else "mixed"


def describe_strategy(spec: JobSpec) -> dict:
    """What a job *asks* for, in the shape of ``result.json``'s ``ran`` (planned steps, before the budget cap).

    Strategy labels use ``ran`` (written by the job's process as each stage starts), never this.
    """
    return {"stages": [{"algorithm": s.algorithm, "peft": "lora" if s.peft else "full",
                        "data_source": data_source_of(s), "steps": s.hyperparameters.max_steps}
                       for s in spec.stage_specs()]}


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


def parse_job(raw, task_family: str | None = None) -> JobSpec:
    """``JobSpec`` of a parsed ``job.yaml`` mapping for a task of ``task_family`` (raises ``ValidationError``)."""
    return JobSpec.model_validate(raw, context={"task_family": task_family})


def spec_to_json(spec: JobSpec) -> str:
    """The spec as JSON for another process (the trainer, the contamination checks): the fields the job set, not
    the defaults filled in, which a spec with stages would refuse (top-level hyperparameters). ``spec_from_json``
    reads it back equal."""
    return spec.model_dump_json(exclude_unset=True)


def spec_from_json(text: str, task_family: str | None = None) -> JobSpec:
    """The ``JobSpec`` that ``spec_to_json`` wrote (raises ``ValidationError``)."""
    return JobSpec.model_validate_json(text, context={"task_family": task_family})


def describe_errors(e: ValidationError) -> list[tuple[str, str]]:
    """All errors of a failed JobSpec validation as ``(field, message)`` pairs."""
    return [error_field(err) for err in e.errors()]


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML keeps the last one silently), deep nesting and more
    than ``max_nodes`` values *as expanded*: an alias stands for a whole subtree, so a few hundred bytes of
    anchors could expand to billions of items. With the size cap (``MAX_JOB_YAML_BYTES``) parsing stays
    short and what it returns stays small."""

    max_depth = 64  # a job is ~4 levels deep; PyYAML takes seconds to hit its recursion limit at ~1,000
    max_nodes = 20_000  # an example job has ~60

    def compose_node(self, parent, index):
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > self.max_depth:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {self.max_depth} levels",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self):
        node = super().compose_document()
        sizes: dict[int, int] = {}

        def expanded(n) -> int:  # values under n with every alias expanded (memoised: linear in nodes)
            if id(n) not in sizes:
                sizes[id(n)] = 0  # an alias cycle counts once
                kids = [x for kv in n.value for x in kv] if isinstance(n, yaml.MappingNode) else (
                    n.value if isinstance(n, yaml.SequenceNode) else [])
                sizes[id(n)] = min(1 + sum(expanded(k) for k in kids), self.max_nodes + 1)
            return sizes[id(n)]

        if node is not None and expanded(node) > self.max_nodes:
            raise yaml.composer.ComposerError(
                None, None, f"more than {self.max_nodes} values (an alias counts as all it repeats)", node.start_mark)
        return node

    def fetch_flow_collection_start(self, token_class):
        # The scanner reads a whole flow collection ahead (quadratic in its depth) before composing.
        if self.flow_level >= self.max_depth:
            raise yaml.scanner.ScannerError(None, None, f"nested deeper than {self.max_depth} levels", self.get_mark())
        super().fetch_flow_collection_start(token_class)

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
        with open(path, "rb") as f:  # never more than the cap into memory
            data = f.read(MAX_JOB_YAML_BYTES + 1)
    except OSError as e:
        raise JobSpecError(f"{path.name} cannot be read: {e.strerror or e}") from None
    if len(data) > MAX_JOB_YAML_BYTES:
        raise JobSpecError(f"{path.name} is over {MAX_JOB_YAML_BYTES // 1024} KB; a job is a short file (data belongs "
                           "in data.jsonl or library sources)")
    try:
        return yaml.load(data.decode("utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 (safe loader)
    except UnicodeDecodeError:
        raise JobSpecError(f"{path.name} is not UTF-8 text") from None
    except RecursionError:
        raise JobSpecError(f"{path.name} is nested too deeply to be a job; write plain key: value lines") from None
    except ValueError as e:  # e.g. an integer of thousands of digits (Python refuses to convert it)
        raise JobSpecError(f"{path.name} holds a value that cannot be read ({str(e).split(';')[0]})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = " ".join(filter(None, [getattr(e, "context", None), getattr(e, "problem", None)])) or str(e)
        raise JobSpecError(f"{path.name}{where} is not valid YAML: {what}") from None


def load_job(job_dir: str | Path, task_family: str | None = None) -> JobSpec:
    """Read and validate ``job.yaml``; raises ``JobSpecError`` (one line per problem) on bad input.

    ``task_family`` is the family of the task the job is for: a data source without ``family`` is its."""
    path = job_path(job_dir)
    if not path.is_file():
        raise JobSpecError(f"{path} not found; a job folder needs a {JOB_FILE}")
    raw = read_job_yaml(path)
    try:
        return parse_job(raw, task_family)
    except ValidationError as e:
        lines = [f"{field}: {msg}" for field, msg in describe_errors(e)]
        raise JobSpecError(f"{path} is invalid:\n" + "\n".join(lines)) from None
