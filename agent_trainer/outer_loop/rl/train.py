"""Outer training: the agent's LoRA learns, by group-relative policy gradient, to write better jobs.

``Trainer`` composes the loop's parts, each testable on its own:

- ``rollouts``: which tasks a step plays (``step_tasks``), its episodes played together (``Rollouts``), their
  inner jobs run in parallel through the executor (``JobRunner``), the held-out families (and, at the start and
  end, the training families) played on fixed seeds with no update (``evaluate_fixed``; when and how: ``heldout``);
- ``policy``: the agent's LoRA and its update (``AgentPolicy``; advantages: ``group_advantages``);
- ``checkpoints``: one folder per complete step, and what a resume reads back;
- ``metrics``: a step's metrics and the run's summary; ``tracker_sync``: their MLflow mirror.

    >>> from agent_trainer.outer_loop.rl.train import TrainSettings, Trainer
    >>> trainer = Trainer(settings, run_dir, agent_dir=resolve_model("tiny-agent"), tracker=tracker)
    >>> summary = trainer.finish(trainer.fit())

Run folder, checkpoints and ``resume=True``: docs/outer_loop.md, "Outer training".
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_trainer.config import AgentConfig, Config, HardwareConfig, OuterConfig
from agent_trainer.inner_loop.run.request import JobSettings
from agent_trainer.outer_loop.episode.episode import EpisodeResult, EpisodeSettings
from agent_trainer.outer_loop.rl import heldout
from agent_trainer.outer_loop.rl.checkpoints import (
    StepState, last_complete_step, load_replay, read_metrics_file, save_step,
)
from agent_trainer.outer_loop.rl.metrics import step_metrics, summarize, training_gain
from agent_trainer.outer_loop.rl.objective import TurnSample, mix_replay, turn_samples
from agent_trainer.outer_loop.rl.policy import AgentPolicy, device_kwargs
from agent_trainer.outer_loop.rl.rollouts import JobRunner, Rollouts, evaluate_fixed, step_tasks
from agent_trainer.outer_loop.rl.tracker_sync import sync_tracker
from agent_trainer.outer_loop.strategy.strategy import run_metrics


@dataclass
class TrainSettings:
    """What ``at-train`` does per step: the ``outer`` group itself (steps, groups, held-out evaluation, the update:
    ``agent_trainer.config.OuterConfig``), ``seed``, and what is built from the other groups."""

    outer: OuterConfig = field(default_factory=OuterConfig)
    seed: int = Config.seed
    train_tasks: list[str] = field(default_factory=list)     # task spec paths
    heldout_tasks: list[str] = field(default_factory=list)
    episode: EpisodeSettings = field(default_factory=EpisodeSettings)
    job: JobSettings = field(default_factory=JobSettings)      # how each inner job runs
                                                               # (agent_trainer.inner_loop.run.request)


def load_tasks(paths: list[str]):
    """The task specs at ``paths`` (relative to the project or absolute)."""
    from agent_trainer.paths import resolve_path
    from agent_trainer.evaluation.tasks import load_task

    return [load_task(resolve_path(p)) for p in paths]


class Trainer:
    """The outer loop: per step, rollouts, the policy's update, a checkpoint, the MLflow mirror."""

    def __init__(self, settings: TrainSettings, run_dir: str | Path, agent_dir: str | Path, *, ledger=None,
                 tracker=None, executor=None, state: StepState | None = None, progress: bool = True,
                 model_name: str | None = None, steering=None, sampler=None,
                 agent_device: str = HardwareConfig.agent_device.value, tool_format: str = AgentConfig.tool_format):
        """``state``: from ``checkpoints.prepare_resume`` to continue a run (open the ledger after that call);
        ``model_name``: the agent's name in the ledger's price table (default: the folder's name);
        ``steering``: a callable giving each episode its strategy layer
        (``agent_trainer.outer_loop.strategy.steering.make_steering``); ``sampler``: a backend that samples the agent's
        turns instead of the policy's own model (``agent=vllm``: a ``VLLMBackend(trainable=True)`` of the same base),
        given the policy's weights at the start and after every update (``load_weights``); ``agent_device``: where the
        policy samples and is updated (``cpu``, ``cuda``: ``hardware.agent_device``); ``tool_format``: how the policy's
        turns write tool calls (``agent.tool_format``; ``auto``: from its chat template)."""
        from agent_trainer.outer_loop.agents.local import LocalBackend

        self.settings, self.run_dir = settings, Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.ledger, self.tracker, self.progress = ledger, tracker, progress
        self.train_tasks = load_tasks(settings.train_tasks)
        self.heldout_tasks = load_tasks(settings.heldout_tasks)
        if not self.train_tasks:
            raise ValueError("outer.train_tasks is empty: list task spec files of the training families")
        self.state = state or StepState()
        self.replay: list[TurnSample] = []   # rollouts kept for reuse while <= max_steps_off_policy old
        ckpt = last_complete_step(self.run_dir) if state is not None else None
        device_kw = device_kwargs(agent_device)
        if ckpt is not None:
            self.policy = AgentPolicy.from_pretrained(agent_dir, settings.outer, adapter_dir=ckpt / "adapter",
                                                      trainer_kwargs=device_kw)
            self.policy.load_state(ckpt)
            self.replay = [TurnSample(**d) for d in load_replay(ckpt)]
        else:
            self.policy = AgentPolicy.from_pretrained(agent_dir, settings.outer, seed=settings.seed,
                                                      trainer_kwargs=device_kw)
        self.model_name = model_name or Path(agent_dir).name.split("-seed")[0]
        self.backend = sampler or LocalBackend(self.policy.model, self.policy.tokenizer, device=agent_device,
                                               model_name=self.model_name, tool_format=tool_format)
        self.jobs = JobRunner(executor, settings.job)
        self.rollouts = Rollouts(self.backend, self.run_dir, settings.episode, self.jobs, ledger=ledger,
                                 model_name=self.model_name, steering=steering,
                                 overlap_jobs=settings.outer.overlap_jobs)
        self.sync_sampler()

    def close(self) -> None:
        """Stop a separate sampler's engine (vLLM); the local backend's ``close`` is the base class's no-op."""
        self.backend.close()

    def sync_sampler(self) -> None:
        """Give a separate sampler (vLLM) the policy's current weights; the local backend shares them already
        and drops the keys and values it kept (computed with the weights before). A served sampler
        (``agent.sampler=served``) gets the LoRA itself, saved under the run folder."""
        if hasattr(self.backend, "forget"):
            self.backend.forget()
        if hasattr(self.backend, "push_adapter"):
            self.backend.push_adapter(self.policy, self.run_dir)
        elif hasattr(self.backend, "load_weights"):
            self.backend.load_weights(self.policy.merged_weights())

    # --- one step --------------------------------------------------------------------------
    def play(self, tasks: list, step: int) -> list:
        """Step ``step``'s training episodes (``group_size`` per task), played to their end, jobs run."""
        return self.rollouts.play(tasks, self.settings.outer.group_size, step, "train",
                                  seed_base=(self.settings.seed, step))

    def step(self, step: int) -> dict[str, float]:
        t0 = time.time()
        self.jobs.reset()
        outer = self.settings.outer
        held_before, held_after = heldout.schedule(step, outer.steps, outer.heldout_every, outer.heldout_at_start,
                                                   enabled=bool(self.heldout_tasks) and outer.heldout_episodes > 0)
        tasks = step_tasks(self.train_tasks, self.settings.seed, outer.tasks_per_step, step)
        episodes = self.play(tasks, step)
        t2 = time.time()
        jobs_s = self.jobs.waited
        results = [ep.finish() for ep in episodes]
        # Before the update: the policy that played this step's training episodes (step 0: the warm start).
        held = self.evaluate(heldout.HELDOUT, step, heldout.PREFIX) if held_before else {}
        trained = self.evaluate(heldout.TRAIN, step, heldout.TRAIN.prefix) if self.train_eval and step == 0 else {}
        fresh = self.samples(results, tasks)
        samples, self.replay = mix_replay(self.replay, fresh, self.policy.version,
                                          self.settings.outer.max_steps_off_policy)
        update = self.policy.update(samples) if fresh else {"skipped": 1.0}
        if fresh:
            self.sync_sampler()
        update["replayed"] = float(len(samples) - len(fresh))
        t3 = time.time()
        # jobs: what the step waited for jobs beyond the sampling; jobs_busy: time inside job batches
        # (summed over the threads feeding them: it overlaps the sampling when outer.overlap_jobs is on)
        seconds = {"sampling": t2 - t0 - jobs_s, "jobs": jobs_s, "jobs_busy": self.jobs.busy,
                   "update": t3 - t2 - held.get("seconds_heldout", 0.0) - trained.get(heldout.TRAIN.seconds, 0.0)}
        metrics = step_metrics(results, update, seconds, self.ledger)
        metrics.update(run_metrics([r.strategy for r in results]))
        metrics.update(self.jobs.stats)
        metrics.update(held)
        metrics.update(trained)
        if held_after:   # the last step: the policy the run leaves
            metrics.update(self.end_of_run(heldout.HELDOUT, step, metrics))
        if self.train_eval and step == self.settings.outer.steps - 1:
            metrics.update(self.end_of_run(heldout.TRAIN, step, metrics))
        if step == self.settings.outer.steps - 1:   # the last step: the training gain's interval, over the episodes
            metrics.update(training_gain(self.run_dir, self.settings.outer.steps))
        metrics["seconds_step"] = time.time() - t0
        return metrics

    @property
    def train_eval(self) -> bool:
        """Whether the training families are played on fixed seeds at the start and the end."""
        return self.settings.outer.train_eval_episodes > 0

    def evaluate(self, evaluation: heldout.Evaluation, step: int, prefix: str) -> dict[str, Any]:
        """The current policy on a fixed-seed evaluation's tasks (``rollouts.evaluate_fixed``): the held-out
        families ``heldout_episodes`` times each, or every training task ``train_eval_episodes`` times (the same
        episodes as ``scripts/policy_eval.py --families train``)."""
        tasks, episodes = self.fixed_tasks(evaluation)
        return evaluate_fixed(self.rollouts, tasks, episodes, step, prefix)

    def fixed_tasks(self, evaluation: heldout.Evaluation) -> tuple[list, int]:
        """``(tasks, episodes per task)`` of a fixed-seed evaluation."""
        if evaluation is heldout.TRAIN:
            return self.train_tasks, self.settings.outer.train_eval_episodes
        return self.heldout_tasks, self.settings.outer.heldout_episodes

    def end_of_run(self, evaluation: heldout.Evaluation, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """An evaluation after the last update and its paired gain over the start (``heldout.paired``; none when
        the start was played with other episodes). ``metrics``: the last step's so far; its seconds of that
        evaluation grow by the end's."""
        end = self.evaluate(evaluation, step, evaluation.end_prefix)
        end[evaluation.seconds] = metrics.get(evaluation.seconds, 0.0) + end[evaluation.seconds]
        start = heldout.start_row([*read_metrics_file(self.run_dir)[:1], {"step": step, **metrics, **end}],
                                  evaluation.prefix)
        if start is not None:
            end.update(heldout.paired(evaluation, start, end, self.fixed_tasks(evaluation)[1]))
        return end

    def samples(self, results: list[EpisodeResult], tasks: list) -> list[TurnSample]:
        """``turn_samples`` at the policy's current version."""
        return turn_samples(results, tasks, self.settings.outer, self.policy.version)

    # --- the loop --------------------------------------------------------------------------
    def checkpoint(self, step: int, metrics: dict[str, float]) -> None:
        """Step ``step``'s checkpoint and metrics row (``checkpoints.save_step``)."""
        save_step(self.run_dir, step, self.policy, self.replay, metrics, self.state)

    def sync_tracker(self) -> None:
        """The MLflow mirror of the complete steps (``tracker_sync.sync_tracker``)."""
        sync_tracker(self.tracker, self.run_dir)

    def fit(self) -> list[dict]:
        """Run the remaining steps; returns every complete step's metrics."""
        from tqdm.auto import tqdm

        self.sync_tracker()
        steps = self.settings.outer.steps
        bar = tqdm(range(self.state.step, steps), initial=self.state.step, total=steps,
                   desc="outer steps", disable=not self.progress)
        for step in bar:
            metrics = self.step(step)
            self.checkpoint(step, metrics)
            self.sync_tracker()
            bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", valid=f"{metrics['valid_first_try']:.2f}")
        return read_metrics_file(self.run_dir)

    def finish(self, rows: list[dict]) -> dict[str, Any]:
        """Plots (run folder and MLflow artifacts) and a summary of the run."""
        from agent_trainer.outer_loop.report.plots import write_training_plots

        plots = write_training_plots(rows, self.run_dir / "plots")
        if self.tracker is not None and plots:
            self.tracker.log_artifacts(self.run_dir / "plots", artifact_path="plots")
        summary = summarize(rows)
        summary["run_dir"] = str(self.run_dir)
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary
