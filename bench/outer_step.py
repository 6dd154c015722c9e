"""(d) Where an outer step's time goes: agent sampling, validation, inner jobs, evaluation, update.

Runs ``at-train``'s trainer (``experiment=smoke`` by default, sequential jobs, not overlapped with the sampling, so that
the job-side sums are wall time, job cache off) for a few steps and splits each step with the numbers the trainer
logs per step (``metrics.jsonl``: ``seconds_sampling``, ``seconds_jobs``, ``seconds_update`` and the
job-side sums ``seconds_jobs_validate``/``_process``/``_eval``), plus the agent's own
``validate_job`` calls timed here (they happen inside sampling):

- agent sampling: the agent's turns (generation, tool calls) without its validation calls;
- validation: the agent's validate_job calls + the harness's validation of submitted jobs;
- inner jobs: the training processes (start-up, data, training, saving);
- evaluation: hidden scoring of the trained models (baselines are cached);
- update: the policy-gradient update of the agent's LoRA;
- other: the rest (episode bookkeeping, staged rewards, checkpoint, logging).

    .venv/bin/python bench/outer_step.py                           # 3 steps of experiment=smoke
    .venv/bin/python bench/outer_step.py --steps 1                 # a quick check
    .venv/bin/python bench/outer_step.py --overrides experiment=cpu_default outer.steps=2
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

PARTS = ("agent_sampling", "validation", "inner_jobs", "evaluation", "update", "other")


def split(row: dict, agent_validation: float) -> dict[str, float]:
    """One metrics.jsonl row -> seconds per part (sums to seconds_step)."""
    parts = {"agent_sampling": row["seconds_sampling"] - agent_validation,
             "validation": agent_validation + row.get("seconds_jobs_validate", 0.0),
             "inner_jobs": row.get("seconds_jobs_process", 0.0),
             "evaluation": row.get("seconds_jobs_eval", 0.0),
             "update": row["seconds_update"]}
    parts["other"] = row["seconds_step"] - sum(parts.values())
    return {k: round(v, 3) for k, v in parts.items()}


def main() -> None:
    p = C.parser(__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--overrides", nargs="*", default=["experiment=smoke"])
    a = p.parse_args()
    C.one_thread()
    import agent_trainer.inner_loop.spec.validate as validate_mod
    from agent_trainer.config import compose_config
    from agent_trainer.outer_loop.rl.run_config import build_trainer, quiet_libraries
    from agent_trainer.outer_loop.rl.rollouts import JobRunner

    wd = C.workdir(a.workdir, "outer")
    cfg = compose_config([*a.overrides, "hardware=cpu", "hardware.threads_per_job=1", "inner.cache=false",
                          "outer.overlap_jobs=false", "tracking=off", f"runs_dir={wd}", "run_id=bench",
                          f"outer.steps={a.steps}"], "train")
    quiet_libraries()

    # The agent's validate_job calls happen inside sampling; time them (jobs' validations are logged).
    agent_validation = {"now": 0.0}
    in_jobs = {"on": False}
    original_validate, original_run_jobs = validate_mod.validate_job, JobRunner.run

    def timed_validate(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original_validate(*args, **kwargs)
        finally:
            if not in_jobs["on"]:
                agent_validation["now"] += time.perf_counter() - t0

    def marked_run_jobs(self, episodes):
        in_jobs["on"] = True
        try:
            return original_run_jobs(self, episodes)
        finally:
            in_jobs["on"] = False

    validate_mod.validate_job = timed_validate
    JobRunner.run = marked_run_jobs
    run_dir = wd / "bench"
    trainer = build_trainer(cfg, run_dir)
    per_step, rows = [], []
    for step in range(a.steps):
        agent_validation["now"] = 0.0
        row = trainer.step(step)
        trainer.checkpoint(step, row)
        rows.append(row)
        per_step.append(split({**row, "seconds_step": row["seconds_step"]}, agent_validation["now"]))
    total = {k: round(sum(s[k] for s in per_step), 3) for k in PARTS}
    whole = sum(total.values())
    C.table([(k, *[s[k] for s in per_step], total[k], f"{100 * total[k] / whole:.1f}%") for k in PARTS],
            ("part", *[f"step{i}_s" for i in range(a.steps)], "total_s", "share"))
    print(f"episodes per step: {[int(r.get('episodes', 0)) for r in rows]}; "
          f"seconds_jobs (wall) per step: {[round(r['seconds_jobs'], 2) for r in rows]}")
    C.write(a.json, "outer_step", {"args": vars(a), "per_step": per_step, "total": total,
                                   "shares": {k: round(total[k] / whole, 4) for k in PARTS},
                                   "metrics": json.loads(json.dumps(rows, default=float))})


if __name__ == "__main__":
    main()
