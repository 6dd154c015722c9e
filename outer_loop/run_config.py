"""From a composed Hydra config to the outer loop's objects (settings, ledger, agent, trainer).

Kept apart from the scripts so tests build exactly what ``at-train`` / ``at-episode`` build.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from evaluation.staged_reward import RewardWeights
from outer_loop.episode import EpisodeSettings
from outer_loop.policy import PolicyConfig
from outer_loop.train import TrainSettings, Trainer


def quiet_libraries() -> None:
    """No per-load progress bars or advice from transformers/datasets during a long run."""
    import datasets
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()


def spec_paths(cfg: DictConfig, families) -> list[str]:
    """Task spec files of ``families`` (``task.spec_pattern`` with ``{family}``)."""
    return [str(cfg.task.spec_pattern).format(family=f) for f in families]


def episode_settings(cfg: DictConfig) -> EpisodeSettings:
    a = cfg.agent
    return EpisodeSettings(max_turns=int(a.max_turns), max_jobs=int(cfg.budget.max_jobs_per_episode),
                           temperature=float(a.temperature), max_new_tokens=int(a.max_new_tokens),
                           validate_dry_run=bool(a.validate_dry_run), tool_schemas=str(a.tool_schemas),
                           reward=RewardWeights(), reward_pick=str(cfg.strategy.episode_reward))


def job_kwargs(cfg: DictConfig) -> dict[str, Any]:
    """Keyword arguments of every ``run_job`` call from the inner and hardware groups."""
    return {"cache_dir": cfg.cache_dir, "hidden_n": cfg.inner.eval_size, "timeout_s": cfg.inner.timeout_s,
            "price_per_hour": float(cfg.hardware.usd_per_hour), "threads": cfg.hardware.threads_per_job,
            "warm": bool(cfg.inner.warm_workers), "cache": bool(cfg.inner.cache), "sandbox": sandbox_settings(cfg),
            "device": str(cfg.hardware.device), "vllm": bool(cfg.hardware.inner_vllm)}


def sandbox_settings(cfg: DictConfig) -> dict[str, Any]:
    """``run_job(sandbox=...)`` / ``validate_job(sandbox=...)`` from the inner group (``inner_loop.sandbox``)."""
    from inner_loop.sandbox import SandboxPolicy

    return SandboxPolicy.from_config(cfg.inner).as_dict()


def steering_factory(cfg: DictConfig, run_dir: Path, ledger=None):
    """A callable giving each training episode its strategy layer, or None with ``strategy=none``."""
    from outer_loop.steering import make_steering, wanted

    if not wanted(cfg.strategy):
        return None
    return lambda: make_steering(cfg.strategy, run_dir=run_dir, ledger=ledger, cache_dir=cfg.cache_dir)


def train_settings(cfg: DictConfig) -> TrainSettings:
    """``TrainSettings`` from the outer, task, agent, budget and hardware groups."""
    o = cfg.outer
    families = list(cfg.task.train_families)
    if not families:
        from evaluation.tasks import load_task

        families = [load_task(cfg.task.spec_path).family]
    targets = o.lora_target_modules
    targets = str(targets) if isinstance(targets, str) else [str(t) for t in targets]
    policy = PolicyConfig(lr=float(o.lr), lr_warmup_steps=int(o.lr_warmup_steps), lora_r=int(o.lora_r),
                          lora_alpha=float(o.lora_alpha), target_modules=targets,
                          clip_eps_low=float(o.clip_eps),
                          clip_eps_high=float(o.clip_eps_high if o.clip_eps_high is not None else o.clip_eps),
                          kl_beta=float(o.kl_beta), scale_by_std=bool(o.scale_by_std), epochs=int(o.epochs),
                          micro_batch_size=int(o.micro_batch_size), max_grad_norm=float(o.max_grad_norm),
                          loss_aggregation=str(o.loss_aggregation), focus_top_frac=float(o.focus_top_frac),
                          focus_entropy_of=str(o.focus_entropy_of))
    return TrainSettings(steps=int(o.steps), tasks_per_step=int(o.tasks_per_step), group_size=int(o.group_size),
                         train_tasks=spec_paths(cfg, families),
                         heldout_tasks=spec_paths(cfg, cfg.task.held_out_families),
                         heldout_every=int(o.heldout_every), heldout_episodes=int(o.heldout_episodes),
                         heldout_at_start=bool(o.heldout_at_start),
                         max_steps_off_policy=int(o.max_steps_off_policy), overlap_jobs=bool(o.overlap_jobs),
                         seed=int(cfg.seed), policy=policy,
                         episode=episode_settings(cfg), job_kwargs={**job_kwargs(cfg), "progress": False})


def make_ledger(cfg: DictConfig, run_dir: Path):
    """The run's ledger with the budget caps and prices of the config."""
    from outer_loop.ledger import Budget, Ledger, Prices

    b, a = cfg.budget, cfg.agent
    budget = Budget(episode_usd=b.max_usd_per_episode, episode_tokens=b.max_tokens_per_episode,
                    episode_jobs=b.max_jobs_per_episode, run_usd=b.max_usd_per_run, run_tokens=b.max_tokens_per_run)
    prices = Prices(llm={str(a.model): (float(a.usd_per_1m_tokens_in), float(a.usd_per_1m_tokens_out))},
                    default_llm=(float(a.usd_per_1m_tokens_in), float(a.usd_per_1m_tokens_out)),
                    default_job_usd_per_hour=float(cfg.hardware.usd_per_hour))
    return Ledger.open(run_dir, budget=budget, prices=prices)


def agent_dir(cfg: DictConfig) -> Path:
    """The local agent's weights: ``agent.model_path``, or ``agent.model`` by name: any model of the registry
    (tiny-agent is built on first use; smollm2-135m; ``+base_models.<name>.path=``) or a warm-started agent
    (``outer_loop.agent_warm_start``: smollm2-agent, built on first use)."""
    if cfg.agent.model_path:
        return Path(str(cfg.agent.model_path))
    from outer_loop.agent_model import register
    from outer_loop.agent_warm_start import resolve_agent

    register()
    return resolve_agent(str(cfg.agent.model), cache_dir=cfg.cache_dir)


def make_executor(cfg: DictConfig):
    """The inner-job executor of the hardware group."""
    from omegaconf import OmegaConf

    from inner_loop.executor import make_executor as make

    h = cfg.hardware
    return make(str(h.executor), max_parallel=int(h.max_parallel_jobs), threads=h.threads_per_job,
                folder=str(h.launcher_dir), partition=h.slurm_partition, gpus_per_job=int(h.gpus_per_job),
                cpus_per_job=h.cpus_per_job, mem_gb=h.mem_gb, time_limit_min=h.time_limit_min,
                additional=OmegaConf.to_container(h.slurm_additional, resolve=True), address=h.ray_address)


def execution_plan(cfg: DictConfig) -> dict[str, Any]:
    """How ``at-train`` would run inner jobs (the executor's plan for one outer step's batch), without running any."""
    from agent_trainer.paths import resolve_path
    from evaluation.tasks import load_task

    settings = train_settings(cfg)
    executor = make_executor(cfg)
    task = load_task(resolve_path(settings.train_tasks[0]))
    n_jobs = settings.tasks_per_step * settings.group_size * int(cfg.budget.max_jobs_per_episode)
    batch = [dict(job_dir=f"<episode {i}>/job", task=task, **settings.job_kwargs) for i in range(n_jobs)]
    return {"device": str(cfg.hardware.device), "gpus_per_job": int(cfg.hardware.gpus_per_job),
            "inner_vllm": bool(cfg.hardware.inner_vllm), "agent": f"{cfg.agent.backend} on {cfg.hardware.agent_device}",
            "jobs_per_step_max": n_jobs, "job_cache": bool(cfg.inner.cache), "warm_workers": bool(cfg.inner.warm_workers),
            **executor.plan(batch)}


def agent_threads(cfg: DictConfig, cores: int | None = None) -> int:
    """Torch threads for at-train's process: ``hardware.agent_threads``, else the cores that the jobs running
    alongside (``max_parallel_jobs`` x ``threads_per_job``) leave free, at least 1.

    Jobs run while the agent samples (``outer.overlap_jobs``); on 2 cores, two one-thread jobs plus a
    two-thread sampler made each of the agent's turns ~4x slower than on one thread of its own."""
    h = cfg.hardware
    if h.agent_threads is not None:
        return max(1, int(h.agent_threads))
    cores = cores or os.cpu_count() or 1
    if str(h.executor) not in ("sequential", "local_parallel"):
        return cores   # jobs run elsewhere (SLURM, Ray, submitit)
    per_job = int(h.threads_per_job) if h.threads_per_job else max(1, cores // max(1, int(h.max_parallel_jobs)))
    return max(1, cores - int(h.max_parallel_jobs) * per_job)


def set_agent_threads(cfg: DictConfig) -> int:
    """Apply ``agent_threads(cfg)`` to this process; returns it."""
    import torch

    n = agent_threads(cfg)
    torch.set_num_threads(n)
    return n


def build_trainer(cfg: DictConfig, run_dir: Path, *, tracker=None, resume: bool = False) -> Trainer:
    """The ``Trainer`` that ``at-train`` runs."""
    if str(cfg.agent.backend) not in ("local", "vllm"):
        raise ValueError(f"at-train updates the LoRA of an agent whose weights it holds; agent.backend="
                         f"{cfg.agent.backend} serves someone else's (use agent=tiny_local, agent=vllm, or a local "
                         f"model_path)")
    from outer_loop.train import prepare_resume

    settings = train_settings(cfg)
    set_agent_threads(cfg)
    state = prepare_resume(run_dir) if resume else None  # before the ledger is opened: it may truncate it
    ledger = make_ledger(cfg, run_dir)
    agent = agent_dir(cfg)
    return Trainer(settings, run_dir, agent, ledger=ledger, tracker=tracker,
                   executor=make_executor(cfg), state=state, model_name=str(cfg.agent.model),
                   steering=steering_factory(cfg, run_dir, ledger), sampler=make_sampler(cfg, agent),
                   agent_device=policy_device(cfg), tool_format=str(cfg.agent.tool_format))


def policy_device(cfg: DictConfig) -> str:
    """``hardware.agent_device`` resolved: ``auto`` is ``cuda`` when this process sees a GPU."""
    device = str(cfg.hardware.agent_device)
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def make_sampler(cfg: DictConfig, agent: Path):
    """``agent=vllm``: a vLLM engine of the agent's base model (the folder ``agent``, the policy's), in this
    process, that samples the turns; the policy (transformers + LoRA) is trained as with ``agent=tiny_local``
    and its weights are copied into the engine after each update. None for ``agent=tiny_local`` (the
    policy's own model samples)."""
    if str(cfg.agent.backend) != "vllm":
        return None
    from outer_loop.backends import make_backend

    return make_backend({"kind": "vllm", "model": str(cfg.agent.model), "model_path": str(agent), "trainable": True,
                         "tool_format": str(cfg.agent.tool_format)})
