"""Does the outer update move the tiny agent? A fixed-seed before/after check, minutes not hours.

The agent plays the same 30 episodes (6 seeds x the 5 training families, jobs never run) before and
after K outer steps whose reward is the validation stage alone (the part of the reward the agent
controls without any inner job). Same seeds on both sides, so a difference is the update's doing,
not sampling noise. Prints valid-at-first-try rate, submission rate and tokens per episode.

    .venv/bin/python bench/policy_check.py OUT_DIR [hydra overrides of at-train ...]
    .venv/bin/python bench/policy_check.py /tmp/pc agent.temperature=1.0 outer.lr=3e-4 outer.steps=8

Not a benchmark of speed: a diagnostic of the RL update (docs/outer_loop.md, "Does the agent learn?").
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SEEDS = range(1000, 1006)


def main(argv: list[str]) -> None:
    import torch

    torch.set_num_threads(1)
    from agent_trainer.config import compose_config
    from agent_trainer.outer_loop.episode.episode import Episode
    from agent_trainer.outer_loop.rl.run_config import agent_dir, quiet_libraries, train_settings
    from agent_trainer.outer_loop.rl.train import Trainer

    if not argv:
        raise SystemExit(__doc__)
    quiet_libraries()
    out, overrides = Path(argv[0]), argv[1:]
    cfg = compose_config(["experiment=cpu_default", "tracking=off", "outer.heldout_every=0", *overrides], "train")
    settings = train_settings(cfg)
    shutil.rmtree(out, ignore_errors=True)

    from agent_trainer.evaluation.staged_reward import validation_score

    def proxy(ep) -> float:
        """The validation stage of a submitted job (jobs never run here, so there is no job outcome)."""
        st = ep.box.state
        return validation_score(st.validation_failures()) if st.submitted else 0.0

    class NoJobs(Trainer):
        """Jobs are submitted, never run: the reward is the validation stage of the submitted job."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.jobs.run = lambda episodes: None

        def play(self, tasks, step):
            episodes = super().play(tasks, step)
            self._proxy = {ep.id: proxy(ep) for ep in episodes}
            return episodes

        def samples(self, results, tasks):
            for r in results:
                r.reward.update(validation=self._proxy[r.episode_id], total=0.35 * self._proxy[r.episode_id])
            return super().samples(results, tasks)

    trainer = NoJobs(settings, out, agent_dir(cfg), progress=False)

    def evaluate(tag: str) -> None:
        first = submitted = tokens = n = 0
        for task in trainer.train_tasks:
            for seed in SEEDS:
                ep = Episode(trainer.backend, task, Path(tempfile.mkdtemp()), settings=settings.episode, seed=seed,
                             defer_jobs=True)
                ep.play()
                r = ep.finish()
                first += proxy(ep) == 1.0
                submitted += bool(ep.box.state.submitted)
                tokens += r.tokens_out
                n += 1
        print(f"{tag}: valid_first={first / n:.2f} submitted={submitted / n:.2f} tokens_out={tokens / n:.0f}",
              flush=True)

    t0 = time.time()
    evaluate("before")
    for step in range(settings.outer.steps):
        m = trainer.step(step)
        print(f"step {step}: reward={m['reward_mean']:.3f} valid_first={m['valid_first_try']:.2f} "
              f"kl={m.get('update_kl', 0.0):.4f}", flush=True)
    evaluate(f"after {settings.outer.steps} steps")
    print(f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
