"""Outer training: the agent's LoRA learns, by group-relative policy gradient, to write better jobs.

Each step plays a group of episodes per sampled task (their inner jobs run in parallel through the job
executor), turns staged rewards into group-relative advantages, updates the adapter
(``agent_trainer.outer_loop.rl.policy``), checkpoints and logs; held-out families are played with no update
(``agent_trainer.outer_loop.rl.heldout``).

    >>> from agent_trainer.outer_loop.rl.train import TrainSettings, train
    >>> summary = train(settings, run_dir, agent_dir=resolve_model("tiny-agent"), tracker=tracker)

Run folder, checkpoints and ``resume=True``: docs/outer_loop.md, "Outer training".
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent_trainer.config import Config, OuterConfig
from agent_trainer.inner_loop.run.request import JobRequest, JobSettings
from agent_trainer.outer_loop.rl import heldout
from agent_trainer.outer_loop.episode.episode import Episode, EpisodeResult, EpisodeSettings, reward_metrics
from agent_trainer.outer_loop.rl.policy import (
    AgentPolicy, PolicyConfig, TurnSample, device_kwargs, group_advantages, merge_turns,
)
from agent_trainer.outer_loop.strategy.strategy import run_metrics

CKPT_DIR = "checkpoints"
METRICS_FILE = "metrics.jsonl"
REPLAY_FILE = "replay.json"      # rollouts kept for the next update (max_steps_off_policy > 0)


@dataclass
class TrainSettings:
    """What ``at-train`` does per step: the ``outer`` group's fields of the same names and ``seed``, with the
    schema's defaults (``agent_trainer.config``), and the objects built from the other groups."""

    steps: int = OuterConfig.steps
    tasks_per_step: int = OuterConfig.tasks_per_step
    group_size: int = OuterConfig.group_size
    train_tasks: list[str] = field(default_factory=list)     # task spec paths
    heldout_tasks: list[str] = field(default_factory=list)
    heldout_every: int = OuterConfig.heldout_every          # 0: no held-out evaluation at all
    heldout_episodes: int = OuterConfig.heldout_episodes    # per held-out task and evaluation
    heldout_at_start: bool = OuterConfig.heldout_at_start
    max_steps_off_policy: int = OuterConfig.max_steps_off_policy
    seed: int = Config.seed
    overlap_jobs: bool = OuterConfig.overlap_jobs   # start an episode's last job while the next ones are sampled
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    episode: EpisodeSettings = field(default_factory=EpisodeSettings)
    job: JobSettings = field(default_factory=JobSettings)      # how each inner job runs
                                                               # (agent_trainer.inner_loop.run.request)


@dataclass
class StepState:
    """What a checkpoint remembers besides the adapter and optimizer."""

    step: int = 0                      # steps completed
    ledger_bytes: int = 0
    mlflow_run_id: str | None = None


def _load_tasks(paths: list[str]):
    from agent_trainer.paths import resolve_path
    from agent_trainer.evaluation.tasks import load_task

    return [load_task(resolve_path(p)) for p in paths]


def last_complete_step(run_dir: Path) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    ckpts = sorted((run_dir / CKPT_DIR).glob("step_[0-9][0-9][0-9][0-9]"))
    return ckpts[-1] if ckpts else None


def roll_back(run_dir: Path, state: StepState) -> None:
    """Move aside what a killed step left: ledger records past the checkpoint, its episode folders."""
    ledger = run_dir / "ledger.jsonl"
    if ledger.exists() and ledger.stat().st_size > state.ledger_bytes:
        with open(ledger, "rb+") as fh:
            fh.seek(state.ledger_bytes)
            tail = fh.read()
            fh.truncate(state.ledger_bytes)
        with open(run_dir / "ledger.rolled_back.jsonl", "ab") as out:
            out.write(tail if tail.endswith(b"\n") or not tail else tail + b"\n")
    for ep in (run_dir / "episodes").glob("s*"):
        try:
            step = int(ep.name[1:5])
        except ValueError:
            continue
        if step >= state.step:
            dest = run_dir / "rolled_back" / ep.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.exists():
                shutil.rmtree(dest)
            shutil.move(str(ep), dest)
    metrics = run_dir / METRICS_FILE
    if metrics.exists():
        keep = [ln for ln in metrics.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] < state.step]
        metrics.write_text("".join(ln + "\n" for ln in keep))


def prepare_resume(run_dir: Path) -> StepState:
    """The state after the last complete step, with what a killed step left moved aside (see module doc).

    Call it before opening the run's ledger: it truncates the ledger to the checkpoint's offset."""
    run_dir = Path(run_dir)
    ckpt = last_complete_step(run_dir)
    state = StepState(**json.loads((ckpt / "state.json").read_text())) if ckpt is not None else StepState()
    roll_back(run_dir, state)
    return state


def read_metrics_file(run_dir: Path) -> list[dict]:
    """Per-step metrics of complete steps, in order."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")


def choice_label(value: object) -> str:
    """A job's choice as part of a metric name: the value when it is a short name, else ``other`` (an agent may
    write anything in job.yaml; a metric name it shapes must stay one MLflow accepts)."""
    return value if isinstance(value, str) and _LABEL.fullmatch(value) else "other"


def step_metrics(results: list[EpisodeResult], update: dict, seconds: dict, ledger,
                 prefix: str = "") -> dict[str, float]:
    """Reward, stages, choices and cost of one step's episodes."""
    n = max(1, len(results))
    rewards = [r.reward["total"] for r in results]
    mean = sum(rewards) / n
    m: dict[str, float] = {
        "excluded": float(sum(bool(r.reward.get("excluded")) for r in results)),
        "reward_mean": mean,
        "reward_std": (sum((x - mean) ** 2 for x in rewards) / n) ** 0.5,
        "validation_mean": sum(r.reward["validation"] for r in results) / n,
        "valid_first_try": sum(r.reward["validation"] == 1.0 for r in results) / n,
        "submitted_rate": sum(bool(r.jobs) for r in results) / n,
        # episodes that submitted a job unchanged after validate_job called it INVALID (docs/real_models.md)
        "submitted_unfixed_rate": sum(r.submitted_unfixed > 0 for r in results) / n,
        "job_success_rate": sum(r.reward["job_success"] for r in results) / n,
        "quality_mean": sum(r.reward["quality"] for r in results) / n,
        "speed_mean": sum(r.reward["speed"] for r in results) / n,
        "episodes": float(len(results)),
        "tokens": float(sum(r.tokens_in + r.tokens_out for r in results)),
        "usd": float(sum(r.usd for r in results)),
    }
    ups = [r.reward["uplift"] for r in results if r.reward.get("uplift") is not None]
    m["uplift_mean"] = sum(ups) / len(ups) if ups else 0.0
    for key in ("base_model", "algorithm", "peft"):
        values = [choice_label(r.choices.get(key)) for r in results if r.choices]
        for v in sorted(set(values)):
            m[f"share_{key}_{v}"] = values.count(v) / n
    m = {prefix + k: v for k, v in m.items()}
    if not prefix:
        m.update({f"update_{k}": float(v) for k, v in update.items()})
        m.update({f"seconds_{k}": float(v) for k, v in seconds.items()})
        if ledger is not None:
            tot = ledger.run_totals()
            m["usd_cumulative"] = float(tot.usd)
            m["tokens_cumulative"] = float(tot.tokens)
    return m


class Trainer:
    """The rollout loop around an ``AgentPolicy``."""

    def __init__(self, settings: TrainSettings, run_dir: str | Path, agent_dir: str | Path, *, ledger=None,
                 tracker=None, executor=None, state: StepState | None = None, progress: bool = True,
                 model_name: str | None = None, steering=None, sampler=None, agent_device: str = "cpu",
                 tool_format: str = "auto"):
        """``state``: from ``prepare_resume`` to continue a run (open the ledger after that call);
        ``model_name``: the agent's name in the ledger's price table (default: the folder's name);
        ``steering``: a callable giving each episode its strategy layer
        (``agent_trainer.outer_loop.strategy.steering.make_steering``); ``sampler``: a backend that samples the agent's
        turns instead of the policy's own model (``agent=vllm``: a ``VLLMBackend(trainable=True)`` of the same base),
        given the policy's weights at the start and after every update (``load_weights``); ``agent_device``: where the
        policy samples and is updated (``cpu``, ``cuda``: ``hardware.agent_device``); ``tool_format``: how the policy's
        turns write tool calls (``agent.tool_format``; ``auto``: from its chat template)."""
        self.steering = steering
        from agent_trainer.outer_loop.agents.local import LocalBackend

        self.s, self.run_dir = settings, Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.ledger, self.tracker, self.progress = ledger, tracker, progress
        self.train_tasks = _load_tasks(settings.train_tasks)
        self.heldout_tasks = _load_tasks(settings.heldout_tasks)
        if not self.train_tasks:
            raise ValueError("outer.train_tasks is empty: list task spec files of the training families")
        self.executor = executor
        self._stats_lock = threading.Lock()
        self.jobs_wall = self.jobs_exposed = 0.0
        self.job_stats: dict[str, float] = {}  # this step's cache hits/misses and job time split (_count_jobs)
        self.state = state or StepState()
        self.replay: list[TurnSample] = []   # rollouts kept for reuse while <= max_steps_off_policy old
        ckpt = last_complete_step(self.run_dir) if state is not None else None
        device_kw = device_kwargs(agent_device)
        if ckpt is not None:
            self.policy = AgentPolicy.from_pretrained(agent_dir, settings.policy, adapter_dir=ckpt / "adapter",
                                                      trainer_kwargs=device_kw)
            self.policy.load_state(ckpt)
            if (ckpt / REPLAY_FILE).exists():
                self.replay = [TurnSample(**d) for d in json.loads((ckpt / REPLAY_FILE).read_text())]
        else:
            self.policy = AgentPolicy.from_pretrained(agent_dir, settings.policy, seed=settings.seed,
                                                      trainer_kwargs=device_kw)
        self.model_name = model_name or Path(agent_dir).name.split("-seed")[0]
        self.backend = sampler or LocalBackend(self.policy.model, self.policy.tokenizer, device=agent_device,
                                               model_name=self.model_name, tool_format=tool_format)
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
    def _tasks_for(self, step: int) -> list:
        """Step ``step``'s task specs: consecutive slices of a stream of seeded shuffles of the training
        tasks, so every task comes up equally often (with ``tasks_per_step`` = the number of tasks,
        every step plays them all). The families' rewards differ by more than learning moves them in a
        few steps (0.18 calc_chain .. 0.33 unit_convert), so independent draws per step made the
        reward curve follow the draw (the same dip in every seed-0 run); balanced slices keep the
        steps comparable."""
        n = len(self.train_tasks)
        k = min(self.s.tasks_per_step, n)
        out: list = []
        for slot in range(step * k, step * k + k):
            cycle = list(self.train_tasks)
            random.Random(f"{self.s.seed}/tasks/cycle{slot // n}").shuffle(cycle)
            # a slice across two shuffles may repeat a task: take the next one not in this step yet
            out.append(next(t for t in cycle[slot % n:] + cycle if t not in out))
        return out

    def play(self, tasks: list, group: int, step: int, tag: str, seed_base: tuple[int, ...] | None = None
             ) -> list[Episode]:
        """``group`` episodes per task played to their end, their jobs run through ``run_jobs`` (with several
        jobs per episode, each waits for its job's result before writing the next). With
        ``overlap_jobs`` (and a local executor, no strategy layer) each episode's last job starts as
        soon as the episode ends; otherwise they run batch-wise after all episodes are played.

        Episode g of task i is seeded by ``hash((*seed_base, i, g))``; ``seed_base`` defaults to ``(seed, step)``
        (held-out evaluations pass a fixed one: the same episodes at every evaluation)."""
        seed_base = (self.s.seed, step) if seed_base is None else seed_base
        episodes = []
        for t_i, task in enumerate(tasks):
            for g in range(group):
                ep_dir = self.run_dir / "episodes" / f"s{step:04d}-{tag}-{task.name}-{g}"
                if ep_dir.exists():
                    shutil.rmtree(ep_dir)
                episodes.append(Episode(self.backend, task, ep_dir, ledger=self.ledger, settings=self.s.episode,
                                        episode_id=ep_dir.name, seed=hash((*seed_base, t_i, g)) % (2**31),
                                        defer_jobs=True, job_settings=self.s.job, model_name=self.model_name,
                                        steering=self.steering() if self.steering else None))
        try:
            return self._play(episodes)
        finally:
            if hasattr(self.backend, "forget"):   # the kept keys and values: not through the update's memory
                self.backend.forget()

    def _play(self, episodes: list[Episode]) -> list[Episode]:
        from agent_trainer.outer_loop.episode.episode import play_all

        # Not with a strategy layer: its after-job hooks may call an evaluator model while the agent samples.
        if (not self.s.overlap_jobs or self.steering is not None
                or getattr(self.executor, "kind", "sequential") not in ("local_parallel", "sequential")):
            play_all(episodes, self._run_jobs_blocking)
            self._run_jobs_blocking(episodes)   # the jobs no turn waits for (each episode's last), in one batch
            return episodes
        # Overlapped: an episode's final job starts as soon as the episode ends, while the other
        # episodes are still sampled (on 2 cores: the agent's turns on one, jobs on the other and in the
        # gaps). Results are the same as batch-wise (each job's numbers depend on its content only); only
        # the wall time changes. Jobs an agent waits for mid-episode run batch-wise as before.
        from concurrent.futures import ThreadPoolExecutor

        workers = max(1, getattr(self.executor, "max_parallel", 1))   # executor None: run_job one at a time
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="job-feeder") as feeder:
            futures = []

            def feed(ep: Episode) -> None:
                if not ep.waiting and ep.pending:
                    futures.append(feeder.submit(self.run_jobs, [ep]))

            play_all(episodes, self._run_jobs_blocking, on_end=feed)
            t0 = time.time()
            for fut in futures:
                fut.result()
            self.jobs_exposed += time.time() - t0
        return episodes

    def _run_jobs_blocking(self, episodes: list[Episode]) -> None:
        t0 = time.time()
        self.run_jobs(episodes)
        self.jobs_exposed += time.time() - t0

    def run_jobs(self, episodes: list[Episode]) -> None:
        """Run every pending job of the batch through the executor, then hand results back."""
        pending = [(ep, p) for ep in episodes for p in ep.pending]
        if not pending:
            return
        requests = [JobRequest(p.job_dir, ep.task, p.output_dir, self.s.job) for ep, p in pending]
        t0 = time.time()
        if self.executor is None:
            from agent_trainer.inner_loop.run.job import run_request

            results = [run_request(r) for r in requests]
        else:
            results = self.executor.run(requests)
        with self._stats_lock:   # job feeder threads report here concurrently
            self.jobs_wall += time.time() - t0
            self._count_jobs(results)
        for (ep, p), res in zip(pending, results):
            ep.complete_job(p, res)

    def _count_jobs(self, results: list) -> None:
        """Add a batch's cache hits/misses and where its jobs' time went (summed over jobs) to ``job_stats``.

        A cache hit's validate/process/eval seconds are the original run's: only its lookup counts."""
        from agent_trainer.inner_loop.run.cache import cache_counts

        st = self.job_stats
        for k, v in cache_counts(results).items():
            st[f"cache_{k}"] = st.get(f"cache_{k}", 0.0) + v
        for k in ("validate", "process", "eval"):
            st[f"seconds_jobs_{k}"] = st.get(f"seconds_jobs_{k}", 0.0) + sum(
                float(r.seconds.get(k, 0.0)) for r in results if not getattr(r, "cached", False))

    def step(self, step: int) -> dict[str, float]:
        t0 = time.time()
        self.job_stats = dict.fromkeys(("cache_hits", "cache_misses", "seconds_jobs_validate", "seconds_jobs_process",
                                        "seconds_jobs_eval"), 0.0)
        self.jobs_wall = 0.0     # seconds inside run_jobs, summed over feeder threads (jobs' busy time)
        self.jobs_exposed = 0.0  # seconds the step waited for jobs (what overlapping did not hide)
        held_before, held_after = heldout.schedule(step, self.s.steps, self.s.heldout_every, self.s.heldout_at_start,
                                                   enabled=bool(self.heldout_tasks) and self.s.heldout_episodes > 0)
        tasks = self._tasks_for(step)
        episodes = self.play(tasks, self.s.group_size, step, "train")
        t2 = time.time()
        jobs_s = self.jobs_exposed
        results = [ep.finish() for ep in episodes]
        # Before the update: the policy that played this step's training episodes (step 0: the warm start).
        held = self.evaluate_heldout(step, heldout.PREFIX) if held_before else {}
        fresh = self.samples(results, tasks)
        samples = self.with_replay(fresh)
        update = self.policy.update(samples) if fresh else {"skipped": 1.0}
        if fresh:
            self.sync_sampler()
        update["replayed"] = float(len(samples) - len(fresh))
        t3 = time.time()
        # jobs: what the step waited for jobs beyond the sampling; jobs_busy: time inside job batches
        # (summed over the threads feeding them: it overlaps the sampling when outer.overlap_jobs is on)
        seconds = {"sampling": t2 - t0 - jobs_s, "jobs": jobs_s, "jobs_busy": self.jobs_wall,
                   "update": t3 - t2 - held.get("seconds_heldout", 0.0)}
        metrics = step_metrics(results, update, seconds, self.ledger)
        metrics.update(run_metrics([r.strategy for r in results]))
        metrics.update(self.job_stats)
        metrics.update(held)
        if held_after:   # the last step: the policy the run leaves
            end = self.evaluate_heldout(step, heldout.END_PREFIX)
            metrics["seconds_heldout"] = metrics.get("seconds_heldout", 0.0) + end.pop("seconds_heldout")
            metrics.update(end)
            start = heldout.start_row([*read_metrics_file(self.run_dir)[:1], {"step": step, **metrics}])
            if start is not None:
                metrics.update(heldout.gain_metrics(start[heldout.PREFIX + heldout.REWARDS],
                                                    end[heldout.END_PREFIX + heldout.REWARDS]))
        if step == self.s.steps - 1:   # the last step: the training gain's interval, over the episodes
            metrics.update(training_gain(self.run_dir, self.s.steps))
        metrics["seconds_step"] = time.time() - t0
        return metrics

    def evaluate_heldout(self, step: int, prefix: str) -> dict[str, Any]:
        """Play the held-out families (``heldout_episodes`` each, fixed seeds, no update); their metrics under
        ``prefix`` with the reward's bootstrap interval, and ``seconds_heldout``.

        The training step's job counters and timers are set aside meanwhile: held-out jobs add nothing to
        ``cache_*``, ``seconds_jobs*`` or ``seconds_sampling``."""
        saved = self.job_stats, self.jobs_wall, self.jobs_exposed
        self.job_stats, t0 = {}, time.time()
        tag = "heldout" if prefix == heldout.PREFIX else "heldout-end"
        try:
            episodes = self.play(self.heldout_tasks, self.s.heldout_episodes, step, tag, seed_base=heldout.SEED_BASE)
            results = [ep.finish() for ep in episodes]
        finally:
            self.job_stats, self.jobs_wall, self.jobs_exposed = saved
        metrics = step_metrics(results, {}, {}, None, prefix=prefix)
        metrics.update(heldout.interval_metrics([r.reward["total"] for r in results], prefix))
        metrics["seconds_heldout"] = time.time() - t0
        return metrics

    def samples(self, results: list[EpisodeResult], tasks: list) -> list[TurnSample]:
        """Turn samples with group-relative advantages (one group per task). An episode whose job the machine
        failed (``reward["excluded"]``: the wall-clock safety cap) is left out of its group and of the update."""
        out: list[TurnSample] = []
        for task in tasks:
            group = [r for r in results if r.task == task.name and not r.reward.get("excluded")]
            adv = group_advantages([r.reward["total"] for r in group], self.s.policy.scale_by_std)
            for r, a in zip(group, adv):
                n_tokens = sum(len(t.completion_ids) for t in r.turns)
                weight = 1.0 / n_tokens if self.s.policy.loss_aggregation == "episode" and n_tokens else 1.0
                temperature = r.turns[0].temperature if r.turns else 1.0
                turns = [(t.prompt_ids, t.completion_ids, t.logprobs) for t in r.turns]
                for ctx, comp, lps, mask in merge_turns(turns):
                    out.append(TurnSample(ctx, comp, lps, a, temperature, self.policy.version, r.episode_id, weight,
                                          completion_mask=mask))
        return out

    def with_replay(self, fresh: list[TurnSample]) -> list[TurnSample]:
        """This step's samples plus the kept ones at most ``max_steps_off_policy`` updates old.

        Older rollouts are dropped here; the kept ones enter the clipped objective with their own
        sampler log-probs, so the importance ratio corrects for the policy having moved since."""
        limit = self.s.max_steps_off_policy
        kept = [s for s in self.replay if self.policy.version - s.policy_version <= limit] if limit > 0 else []
        self.replay = [s for s in kept + fresh if self.policy.version + 1 - s.policy_version <= limit]
        return fresh + kept

    # --- the loop --------------------------------------------------------------------------
    def checkpoint(self, step: int, metrics: dict[str, float]) -> None:
        """Write the step's checkpoint atomically (folder renamed into place last)."""
        final = self.run_dir / CKPT_DIR / f"step_{step:04d}"
        tmp = final.with_name(final.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        self.policy.save(tmp)
        (tmp / REPLAY_FILE).write_text(json.dumps([asdict(s) for s in self.replay]))
        with open(self.run_dir / METRICS_FILE, "a") as fh:
            fh.write(json.dumps({"step": step, **metrics}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.state.step = step + 1
        self.state.ledger_bytes = ((self.run_dir / "ledger.jsonl").stat().st_size
                                   if (self.run_dir / "ledger.jsonl").exists() else 0)
        (tmp / "state.json").write_text(json.dumps(asdict(self.state)))
        if final.exists():  # a step checkpointed again (a rolled-back step replayed): the new one wins
            old = final.with_name(final.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        from agent_trainer import sweeps

        if (self.run_dir / sweeps.RUN_FILE).is_file():  # the run folder says it holds a complete step
            sweeps.write_run_file(self.run_dir, steps_completed=step + 1)

    def sync_tracker(self) -> None:
        """Log to MLflow the metrics of complete steps that it does not hold yet (exactly once)."""
        if self.tracker is None or not getattr(self.tracker, "enabled", True):
            return
        from agent_trainer.tracking import metric_key, read_metrics

        key = metric_key("reward_mean")  # metrics.jsonl keeps bare names; MLflow groups them (reward/, time/, ...)
        held_key = metric_key("heldout_reward_mean")
        history = read_metrics(self.tracker.tracking_uri, self.tracker.run_id, [key, held_key])
        logged = {s for s, _ in history[key]}
        held_logged = {s for s, _ in history[held_key]}
        rows = [row for row in read_metrics_file(self.run_dir) if row["step"] not in logged]
        children = self.tracker.child_names() if rows else set()
        for row in rows:
            # Nested episode runs first, then the step's metrics: a kill in between re-logs only the
            # children that are missing (by name), so each appears once.
            for summary in sorted((self.run_dir / "episodes").glob(f"s{row['step']:04d}-*/summary.json")):
                if summary.parent.name not in children:
                    log_episode_run(self.tracker, json.loads(summary.read_text()), row["step"])
            # The row's end evaluation (at the next step) before the row itself, whose reward_mean marks
            # the row as logged: a kill in between re-logs the row only.
            (step, own), *end = heldout.points(row)
            for end_step, values in end:
                if end_step not in held_logged:
                    self.tracker.log_metrics({metric_key(k): v for k, v in values.items()}, step=end_step)
            self.tracker.log_metrics({metric_key(k): v for k, v in own.items()}, step=step)

    def fit(self) -> list[dict]:
        """Run the remaining steps; returns every complete step's metrics."""
        from tqdm.auto import tqdm

        self.sync_tracker()
        bar = tqdm(range(self.state.step, self.s.steps), initial=self.state.step, total=self.s.steps,
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


def log_episode_run(tracker, summary: dict[str, Any], step: int) -> None:
    """One nested MLflow run per episode: its choices as params, its stages and cost as metrics."""
    reward = summary.get("reward") or {}
    with tracker.child(summary["episode_id"],
                       tags={"step": step, "task": summary.get("task"),
                             "split": "heldout" if "-heldout-" in summary["episode_id"] else "train"}) as ep:
        ep.log_params({f"choice.{k}": v for k, v in (summary.get("choices") or {}).items()})
        metrics = reward_metrics(reward)
        metrics.update({k: summary.get(k) for k in ("tokens_in", "tokens_out", "usd", "n_turns")
                        if isinstance(summary.get(k), (int, float))})
        ep.log_metrics(metrics, step=step)


def training_gain(run_dir: Path, steps: int, k: int = 3) -> dict[str, float]:
    """``reward_gain_lo`` / ``_hi``: the bootstrap 95% interval of the last ``k`` steps' training episodes' mean
    reward minus the first ``k`` steps' (each side resampled on its own; excluded episodes left out), read from
    the episodes' ``summary.json``; {} under ``2 k`` steps."""
    from agent_trainer.outer_loop.report.bootstrap import diff_ci

    def rewards(step_range) -> list[float]:
        out = []
        for s in step_range:
            for f in sorted((Path(run_dir) / "episodes").glob(f"s{s:04d}-train-*/summary.json")):
                r = json.loads(f.read_text()).get("reward") or {}
                if not r.get("excluded") and isinstance(r.get("total"), (int, float)):
                    out.append(float(r["total"]))
        return out

    if steps < 2 * k:
        return {}
    first, last = rewards(range(k)), rewards(range(steps - k, steps))
    if not first or not last:
        return {}
    _, lo, hi = diff_ci(first, last)
    return {"reward_gain_lo": lo, "reward_gain_hi": hi}


def summarize(rows: list[dict], k: int = 3) -> dict[str, Any]:
    """First-k and last-k mean reward, their gap, the held-out start, end and paired gain (each with its
    95% interval, ``agent_trainer.outer_loop.rl.heldout.summary``), and how the choices moved."""
    if not rows:
        return {"steps": 0}
    first, last = rows[:k], rows[-k:]

    def mean(xs, key):
        vals = [x.get(key, 0.0) for x in xs]
        return sum(vals) / len(vals)

    out = {"steps": len(rows), f"reward_first{k}": mean(first, "reward_mean"),
           f"reward_last{k}": mean(last, "reward_mean")}
    out["reward_gain"] = out[f"reward_last{k}"] - out[f"reward_first{k}"]
    if "reward_gain_lo" in rows[-1]:
        out["reward_gain_ci"] = [rows[-1]["reward_gain_lo"], rows[-1]["reward_gain_hi"]]
    out.update(heldout.summary(rows))
    for key in sorted({k2 for r in rows for k2 in r
                       if k2.startswith("share_") or k2 in ("valid_first_try", "submitted_unfixed_rate")}):
        out[f"{key}_first{k}"] = mean(first, key)
        out[f"{key}_last{k}"] = mean(last, key)
    out["usd_total"] = rows[-1].get("usd_cumulative", 0.0)
    return out
