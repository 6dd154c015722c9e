"""From the validated config (``agent_trainer.config.Config``) to the outer loop's objects (settings, ledger,
agent, trainer). Each function also takes a composed ``DictConfig`` and validates it first.

Kept apart from the scripts so tests build exactly what ``at-train`` / ``at-episode`` build.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from agent_trainer.config import Config, typed
from agent_trainer.inner_loop.run.job_env import usable_cores
from agent_trainer.inner_loop.run.request import JobRequest, JobSettings
from agent_trainer.outer_loop.episode.episode import EpisodeSettings
from agent_trainer.outer_loop.rl import heldout
from agent_trainer.outer_loop.rl.train import TrainSettings, Trainer

Conf = Config | DictConfig


def quiet_libraries() -> None:
    """No per-load progress bars or advice from transformers/datasets during a long run."""
    import datasets
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()


def spec_paths(cfg: Conf, families) -> list[str]:
    """Task spec files of ``families`` (``task.spec_pattern`` with ``{family}``)."""
    return [typed(cfg).task.spec_pattern.format(family=f) for f in families]


def episode_settings(cfg: Conf) -> EpisodeSettings:
    """``EpisodeSettings`` from the agent, budget and strategy groups and the outer group's reward."""
    return EpisodeSettings.from_config(typed(cfg))


def job_settings(cfg: Conf) -> JobSettings:
    """The ``JobSettings`` of every job (``agent_trainer.inner_loop.run.request``) from the inner and hardware
    groups."""
    return JobSettings.from_config(typed(cfg))


def steering_factory(cfg: Conf, run_dir: Path, ledger=None):
    """A callable giving each training episode its strategy layer, or None with ``strategy=none``."""
    from agent_trainer.outer_loop.strategy.steering import make_steering, wanted

    c = typed(cfg)
    if not wanted(c.strategy):
        return None
    device = policy_device(c)
    return lambda: make_steering(c.strategy, device=device, run_dir=run_dir, ledger=ledger, cache_dir=c.cache_dir)


def train_settings(cfg: Conf) -> TrainSettings:
    """``TrainSettings`` from the outer, task, agent, budget and hardware groups."""
    c = typed(cfg)
    families = c.task.train_families
    if not families:
        from agent_trainer.evaluation.tasks import load_task

        families = [load_task(c.task.spec_path).family]
    return TrainSettings(outer=c.outer, seed=c.seed,
                         train_tasks=spec_paths(c, families), heldout_tasks=spec_paths(c, c.task.held_out_families),
                         episode=episode_settings(c), job=job_settings(c).replace(progress=False))


def make_ledger(cfg: Conf, run_dir: Path):
    """The run's ledger with the budget caps and prices of the config."""
    from agent_trainer.outer_loop.episode.ledger import Ledger, Prices

    c = typed(cfg)
    agent = c.agent
    agent_prices = (agent.usd_per_1m_tokens_in, agent.usd_per_1m_tokens_out)
    prices = Prices(llm={agent.model: agent_prices}, default_llm=agent_prices,
                    default_job_usd_per_hour=c.hardware.usd_per_hour)
    return Ledger.open(run_dir, budget=c.budget, prices=prices)


def agent_dir(cfg: Conf) -> Path:
    """The local agent's weights: ``agent.model_path``, or ``agent.model`` by name: any model of the registry
    (tiny-agent is built on first use; smollm2-135m; ``+base_models.<name>.path=``) or a warm-started agent
    (``agent_trainer.outer_loop.agents.agent_warm_start``: smollm2-agent, built on first use)."""
    c = typed(cfg)
    if c.agent.model_path:
        from agent_trainer.cli_args import UserError
        from agent_trainer.paths import resolve_path

        folder = resolve_path(c.agent.model_path)
        if not (folder / "config.json").is_file():
            raise UserError(f"agent.model_path={c.agent.model_path}: no model there (a Hugging Face model folder "
                            f"with config.json); or leave it null and name a model: agent.model=<name>")
        return folder
    from agent_trainer.outer_loop.agents.agent_model import register
    from agent_trainer.outer_loop.agents.agent_warm_start import resolve_agent

    register()
    return resolve_agent(c.agent.model, cache_dir=c.cache_dir)


def make_executor(cfg: Conf):
    """The inner-job executor of the hardware group."""
    from agent_trainer.inner_loop.run.executor import make_executor as make

    hardware = typed(cfg).hardware
    return make(hardware.executor, max_parallel=hardware.max_parallel_jobs, threads=hardware.threads_per_job,
                folder=hardware.launcher_dir, partition=hardware.slurm_partition, gpus_per_job=hardware.gpus_per_job,
                cpus_per_job=hardware.cpus_per_job, mem_gb=hardware.mem_gb, time_limit_min=hardware.time_limit_min,
                additional=hardware.slurm_additional, jobs_per_task=hardware.jobs_per_task,
                address=hardware.ray_address)


def check_executor(cfg: Conf) -> None:
    """Refuse to start, in one line naming it, when the executor's engine (SLURM's controller, a Ray head) does
    not answer: before any episode is played or model loaded."""
    from agent_trainer.cli_args import UserError

    executor = make_executor(cfg)
    try:
        getattr(executor, "check", lambda: None)()
    except RuntimeError as e:
        raise UserError(str(e)) from None


def execution_plan(cfg: Conf) -> dict[str, Any]:
    """How ``at-train`` would run inner jobs (the executor's plan for one outer step's batch), without running any."""
    from agent_trainer.paths import resolve_path
    from agent_trainer.evaluation.tasks import load_task

    c = typed(cfg)
    settings = train_settings(c)
    executor = make_executor(c)
    task = load_task(resolve_path(settings.train_tasks[0]))
    n_jobs = c.outer.tasks_per_step * c.outer.group_size * c.budget.max_jobs_per_episode
    batch = [JobRequest(Path(f"<episode {i}>/job"), task, settings=settings.job) for i in range(n_jobs)]
    h = c.hardware
    return {"device": h.device.value, "gpus_per_job": h.gpus_per_job, "inner_vllm": h.inner_vllm,
            "agent": f"{c.agent.backend} on {h.agent_device}", "agent_model": c.agent.model_path or c.agent.model,
            "agent_sampler": c.agent.sampler,
            "episodes_per_step": f"{c.outer.tasks_per_step} tasks x {c.outer.group_size}, sampled together",
            "update": (f"LoRA r{c.outer.lora_r}, micro-batches of <= {c.outer.micro_batch_size} rows"
                       + (f" and <= {c.outer.micro_batch_tokens} tokens" if c.outer.micro_batch_tokens else "")
                       + (", gradient checkpointing" if c.outer.gradient_checkpointing else "")
                       + (", the rows' shared opening run once" if c.outer.share_prefix else "")),
            "evaluations": evaluations(settings),
            "jobs_per_step_max": n_jobs,
            "job_cache": c.inner.cache, "warm_workers": c.inner.warm_workers, **executor.plan(batch)}


def evaluations(settings: TrainSettings) -> str:
    """The fixed-seed evaluations a run plays (no update from them), in words."""
    def tasks(n: int) -> str:
        return f"{n} task{'s' if n != 1 else ''}"

    out, outer = [], settings.outer
    held_before = [s for s in range(outer.steps)
                   if heldout.schedule(s, outer.steps, outer.heldout_every, outer.heldout_at_start)[0]]
    if settings.heldout_tasks and outer.heldout_episodes > 0 and outer.heldout_every > 0:
        when = (["start"] if 0 in held_before else []) + [f"step {s}" for s in held_before if s] + ["end"]
        out.append(f"held-out {tasks(len(settings.heldout_tasks))} x {outer.heldout_episodes} ({', '.join(when)})")
    if outer.train_eval_episodes > 0:
        out.append(f"training {tasks(len(settings.train_tasks))} x {outer.train_eval_episodes} (start, end)")
    return "; ".join(out) or "none"


def agent_threads(cfg: Conf, cores: int | None = None) -> int:
    """Torch threads for at-train's process: ``hardware.agent_threads``, else the cores that the jobs running
    alongside (``max_parallel_jobs`` x ``threads_per_job``) leave free, at least 1.

    Jobs run while the agent samples (``outer.overlap_jobs``); on 2 cores, two one-thread jobs plus a
    two-thread sampler made each of the agent's turns ~4x slower than on one thread of its own."""
    h = typed(cfg).hardware
    if h.agent_threads is not None:
        return h.agent_threads
    cores = cores or usable_cores()
    # The same count whatever hardware.executor says, though SLURM's or Ray's jobs may run on other machines: the
    # update's float sums depend on its threads, and changing only the executor must change no number of a run
    # (bench/same_steps.py). On a login node with cores to spare, set hardware.agent_threads.
    per_job = h.threads_per_job or max(1, cores // h.max_parallel_jobs)
    return max(1, cores - h.max_parallel_jobs * per_job)


def set_agent_threads(cfg: Conf) -> int:
    """Apply ``agent_threads(cfg)`` to this process; returns it."""
    import torch

    n = agent_threads(cfg)
    torch.set_num_threads(n)
    return n


def build_trainer(cfg: Conf, run_dir: Path, *, tracker=None, resume: bool = False) -> Trainer:
    """The ``Trainer`` that ``at-train`` runs."""
    c = typed(cfg)
    if c.agent.backend not in ("local", "vllm"):
        raise ValueError(f"at-train updates the LoRA of an agent whose weights it holds; agent.backend="
                         f"{c.agent.backend} serves someone else's (use agent=tiny_local, agent=vllm, or a local "
                         f"model_path)")
    from agent_trainer.outer_loop.rl.checkpoints import prepare_resume

    settings = train_settings(c)
    set_agent_threads(c)
    state = prepare_resume(run_dir) if resume else None  # before the ledger is opened: it may truncate it
    ledger = make_ledger(c, run_dir)
    agent = agent_dir(c)
    return Trainer(settings, run_dir, agent, ledger=ledger, tracker=tracker,
                   executor=make_executor(c), state=state, model_name=c.agent.model,
                   steering=steering_factory(c, run_dir, ledger), sampler=make_sampler(c, agent),
                   agent_device=policy_device(c), tool_format=c.agent.tool_format)


def policy_device(cfg: Conf) -> str:
    """``hardware.agent_device`` resolved: ``auto`` is ``cuda`` when this process sees a GPU."""
    device = typed(cfg).hardware.agent_device.value
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def make_sampler(cfg: DictConfig | Config, agent: Path):
    """``agent=vllm``: a vLLM engine of the agent's base model (the folder ``agent``, the policy's), in this
    process, that samples the turns; the policy (transformers + LoRA) is trained as with ``agent=tiny_local``
    and its weights are copied into the engine after each update. None for ``agent=tiny_local`` (the
    policy's own model samples). ``agent.sampler=served``: a vLLM server at ``agent.base_url`` samples them
    and gets the policy's LoRA after each update (``agent_trainer.outer_loop.agents.served_sampler``)."""
    a = typed(cfg).agent
    if a.sampler == "served":
        from agent_trainer.outer_loop.agents.served_sampler import served_sampler

        return served_sampler(a, agent)
    if a.backend != "vllm":
        return None
    from agent_trainer.outer_loop.agents import make_backend

    return make_backend({"kind": "vllm", "model": a.model, "model_path": str(agent), "trainable": True,
                         "tool_format": a.tool_format})
