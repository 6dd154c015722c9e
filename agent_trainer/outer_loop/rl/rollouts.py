"""Rollouts of the outer loop: which tasks a step plays, its episodes played together, their inner jobs run.

    jobs = JobRunner(executor, job_settings)           # the step's job figures: jobs.stats, .busy, .waited
    rollouts = Rollouts(backend, run_dir, episode_settings, jobs)
    episodes = rollouts.play(step_tasks(tasks, seed, 2, step), 4, step, "train", seed_base=(seed, step))

Each part stands on its own: ``step_tasks`` is a pure function, ``JobRunner`` needs only an executor (or none:
one job after the other, here), ``Rollouts`` a backend that samples turns. The trainer
(``agent_trainer.outer_loop.rl.train``) composes them with the policy's update.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from agent_trainer.config import OuterConfig
from agent_trainer.inner_loop.run.request import JobRequest, JobSettings
from agent_trainer.outer_loop.episode.episode import Episode, EpisodeSettings
from agent_trainer.outer_loop.rl import heldout
from agent_trainer.outer_loop.rl.metrics import step_metrics

JOB_STATS = ("cache_hits", "cache_misses", "seconds_jobs_validate", "seconds_jobs_process", "seconds_jobs_eval")


def step_tasks(tasks: Sequence, seed: int, per_step: int, step: int) -> list:
    """Step ``step``'s task specs: consecutive slices of a stream of seeded shuffles of ``tasks``, so every task
    comes up equally often (with ``per_step`` = the number of tasks, every step plays them all) and a resumed run
    draws what the first run would have. The families' rewards differ by more than learning moves them in a few
    steps (0.18 calc_chain .. 0.33 unit_convert), so independent draws per step made the reward curve follow the
    draw (the same dip in every seed-0 run); balanced slices keep the steps comparable."""
    n = len(tasks)
    k = min(per_step, n)
    out: list = []
    for slot in range(step * k, step * k + k):
        cycle = list(tasks)
        random.Random(f"{seed}/tasks/cycle{slot // n}").shuffle(cycle)
        # a slice across two shuffles may repeat a task: take the next one not in this step yet
        out.append(next(t for t in cycle[slot % n:] + cycle if t not in out))
    return out


class JobRunner:
    """Runs the pending jobs of a batch of episodes through the executor (``None``: one after the other, in this
    process) and hands each result back to its episode. Safe to call from several threads at once.

    What it measured since ``reset()``: ``stats`` (cache hits and misses, seconds of the jobs' validation,
    processing and scoring, summed over jobs; a cache hit's seconds are the original run's, so only its lookup
    counts), ``busy`` (seconds inside ``run``, summed over the threads calling it) and ``waited`` (seconds a
    caller of ``run_waiting`` blocked: what overlapping did not hide)."""

    def __init__(self, executor, settings: JobSettings):
        self.executor, self.settings = executor, settings
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.stats: dict[str, float] = dict.fromkeys(JOB_STATS, 0.0)
        self.busy = self.waited = 0.0

    @property
    def parallel(self) -> int:
        """Jobs the executor runs at once (1 without one)."""
        return max(1, getattr(self.executor, "max_parallel", 1))

    @property
    def local(self) -> bool:
        """Jobs run on this machine (no executor, or a local one): they may overlap the sampling."""
        return getattr(self.executor, "kind", "sequential") in ("local_parallel", "sequential")

    def run(self, episodes: Sequence[Episode]) -> None:
        """Run every pending job of ``episodes``, then give each result to its episode."""
        pending = [(ep, p) for ep in episodes for p in ep.pending]
        if not pending:
            return
        requests = [JobRequest(p.job_dir, ep.task, p.output_dir, self.settings) for ep, p in pending]
        t0 = time.time()
        if self.executor is None:
            from agent_trainer.inner_loop.run.job import run_request

            results = [run_request(r) for r in requests]
        else:
            results = self.executor.run(requests)
        with self._lock:
            self.busy += time.time() - t0
            self.count(results)
        for (ep, p), res in zip(pending, results):
            ep.complete_job(p, res)

    def run_waiting(self, episodes: Sequence[Episode]) -> None:
        """``run``, its time counted as waited for."""
        t0 = time.time()
        self.run(episodes)
        self.waited += time.time() - t0

    def count(self, results: list) -> None:
        """Add a batch's cache hits and misses and where its jobs' time went to ``stats``."""
        from agent_trainer.inner_loop.run.cache import cache_counts

        for k, v in cache_counts(results).items():
            self.stats[f"cache_{k}"] = self.stats.get(f"cache_{k}", 0.0) + v
        for k in ("validate", "process", "eval"):
            self.stats[f"seconds_jobs_{k}"] = self.stats.get(f"seconds_jobs_{k}", 0.0) + sum(
                float(r.seconds.get(k, 0.0)) for r in results if not getattr(r, "cached", False))


class Rollouts:
    """Plays a step's episodes together on ``backend`` (``agent_trainer.outer_loop.episode.episode.play_all``),
    each in its own folder ``<run_dir>/episodes/s<step>-<tag>-<task>-<g>``, their jobs run by ``jobs``.

    ``overlap_jobs``: with a local executor and no strategy layer, each episode's last job starts as soon as the
    episode ends, while the other episodes are still sampled; otherwise the jobs run batch-wise after all episodes
    are played. The results are the same either way (a job's numbers depend on its content only); only the wall
    time changes. ``steering``: a callable giving each episode its strategy layer."""

    def __init__(self, backend, run_dir: Path, settings: EpisodeSettings, jobs: JobRunner, *, ledger=None,
                 model_name: str | None = None, steering: Callable | None = None,
                 overlap_jobs: bool = OuterConfig.overlap_jobs):
        self.backend, self.run_dir, self.settings, self.jobs = backend, Path(run_dir), settings, jobs
        self.ledger, self.model_name, self.steering, self.overlap_jobs = ledger, model_name, steering, overlap_jobs

    def with_jobs(self, jobs: JobRunner) -> "Rollouts":
        """The same rollouts with their jobs run (and counted) by ``jobs``."""
        return Rollouts(self.backend, self.run_dir, self.settings, jobs, ledger=self.ledger,
                        model_name=self.model_name, steering=self.steering, overlap_jobs=self.overlap_jobs)

    def with_backend(self, backend) -> "Rollouts":
        """The same rollouts (folder, settings, jobs, ledger, steering) with the turns sampled by ``backend``."""
        return Rollouts(backend, self.run_dir, self.settings, self.jobs, ledger=self.ledger,
                        model_name=getattr(backend, "model_name", self.model_name), steering=self.steering,
                        overlap_jobs=self.overlap_jobs)

    def play(self, tasks: Sequence, group: int, step: int, tag: str, seed_base: tuple[int, ...]) -> list[Episode]:
        """``group`` episodes per task played to their end, every job run (with several jobs per episode, each
        waits for its job's result before writing the next). Episode g of task i is seeded by
        ``hash((*seed_base, i, g))``: the trainer passes ``(seed, step)``, held-out evaluations a fixed base."""
        episodes = []
        for t_i, task in enumerate(tasks):
            for g in range(group):
                ep_dir = self.run_dir / "episodes" / f"s{step:04d}-{tag}-{task.name}-{g}"
                if ep_dir.exists():
                    shutil.rmtree(ep_dir)
                episodes.append(Episode(self.backend, task, ep_dir, ledger=self.ledger, settings=self.settings,
                                        episode_id=ep_dir.name, seed=hash((*seed_base, t_i, g)) % (2**31),
                                        defer_jobs=True, job_settings=self.jobs.settings, model_name=self.model_name,
                                        steering=self.steering() if self.steering else None))
        try:
            return self._play(episodes)
        finally:
            if hasattr(self.backend, "forget"):   # the kept keys and values: not through the update's memory
                self.backend.forget()

    def _play(self, episodes: list[Episode]) -> list[Episode]:
        from agent_trainer.outer_loop.episode.episode import play_all

        # Not with a strategy layer: its after-job hooks may call an evaluator model while the agent samples.
        if not self.overlap_jobs or self.steering is not None or not self.jobs.local:
            play_all(episodes, self.jobs.run_waiting)
            self.jobs.run_waiting(episodes)   # the jobs no turn waits for (each episode's last), in one batch
            return episodes
        # Overlapped (on 2 cores: the agent's turns on one, jobs on the other and in the gaps). Jobs an agent
        # waits for mid-episode run batch-wise as before.
        from concurrent.futures import ThreadPoolExecutor

        from agent_trainer.inner_loop.run.worker import stop_jobs_on_error

        # An interrupt here (at-train's SIGTERM) stops the fed jobs at once instead of waiting for them to end.
        with ThreadPoolExecutor(max_workers=self.jobs.parallel, thread_name_prefix="job-feeder") as feeder, \
                stop_jobs_on_error(feeder):
            futures = []

            def feed(ep: Episode) -> None:
                if not ep.waiting and ep.pending:
                    futures.append(feeder.submit(self.jobs.run, [ep]))

            play_all(episodes, self.jobs.run_waiting, on_end=feed)
            t0 = time.time()
            for fut in futures:
                fut.result()
            self.jobs.waited += time.time() - t0
        return episodes


def evaluate_fixed(rollouts: Rollouts, tasks: Sequence, episodes: int, step: int, prefix: str) -> dict[str, Any]:
    """Play ``tasks`` (``episodes`` each, on the fixed seeds ``heldout.SEED_BASE``, no update): their metrics under
    ``prefix`` (one of ``heldout.EVALUATIONS``': held-out or training families, before an update or after the
    last) with the reward's bootstrap interval, and the evaluation's seconds. Their jobs run on the same executor
    but are counted apart: they add nothing to the training step's ``JobRunner`` figures."""
    t0 = time.time()
    evaluation = heldout.evaluation_of(prefix)
    own = rollouts.with_jobs(JobRunner(rollouts.jobs.executor, rollouts.jobs.settings))
    played = own.play(tasks, episodes, step, evaluation.tag_of(prefix), seed_base=heldout.SEED_BASE)
    results = [ep.finish() for ep in played]
    metrics = step_metrics(results, {}, {}, None, prefix=prefix)
    metrics.update(heldout.interval_metrics([r.reward["total"] for r in results], prefix))
    metrics[evaluation.seconds] = time.time() - t0
    return metrics
