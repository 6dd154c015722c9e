"""What does each job choice earn? One real job per (family, base, algorithm, learning rate, steps).

Runs the jobs the novice prior can write (SFT or GRPO, full fine-tuning, batch 32, 1,000 library rows
of the task's family; GRPO with the family's default rewards) under a task budget, scores each on the
hidden set and prints the staged reward it would earn when valid at the first try, then the mean
reward by choice. This is the landscape the outer loop climbs (docs/outer_loop.md): where the
reward's spread comes from, so which choices a learning agent should move toward.

    .venv/bin/python bench/reward_landscape.py                      # 5 families x 2 x 2 x 3 x 2 = 120 jobs
    .venv/bin/python bench/reward_landscape.py --families calc_chain --lrs 1e-4,1e-3 --jsonl /tmp/l.jsonl

Jobs go through the job cache (a rerun is free) and one worker at a time; ~12 minutes on one core.
Not a speed benchmark: a diagnostic of the reward.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, parser, workdir  # noqa: E402

FAMILIES = "calc_chain,reverse_text,sort_numbers,unit_convert,count_char"


def job_for(family: str, base: str, algorithm: str, lr: float, steps: int) -> dict:
    """The job a novice would write for these choices (agent_trainer.outer_loop.agents.novice's rendering and
    defaults)."""
    from agent_trainer.evaluation.families import get_family
    from agent_trainer.outer_loop.agents.novice import default_rewards

    fam = get_family(family)
    hp: dict = {"learning_rate": lr, "max_steps": steps, "batch_size": 32}
    job: dict = {"base_model": base, "algorithm": algorithm}
    if algorithm == "grpo":
        hp.update(num_generations=8, max_completion_length=fam.max_new_tokens + 2)
        job["reward"] = {"functions": [{"name": n} for n in default_rewards(fam.scorer)]}
    job["hyperparameters"] = hp
    job["data"] = {"sources": [{"family": family, "size": 1000}]}
    return job


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--families", default=FAMILIES)
    p.add_argument("--bases", default="tiny-s,tiny-m")
    p.add_argument("--algorithms", default="sft,grpo")
    p.add_argument("--lrs", default="1e-4,1e-3,5e-3")
    p.add_argument("--steps", default="20,100")
    p.add_argument("--budget", default="tiny",
                   help="task spec budget: tiny | fast (examples/tasks/<family>_v1_<budget>.json)")
    p.add_argument("--jsonl", type=Path, default=None, help="append one JSON line per job here")
    a = p.parse_args()

    import torch

    torch.set_num_threads(1)
    from agent_trainer.evaluation.staged_reward import staged_reward
    from agent_trainer.evaluation.tasks import load_task
    from agent_trainer.inner_loop.run.job import run_job
    from agent_trainer.outer_loop.agents.novice import render_job

    root = workdir(a.workdir, "landscape")
    grid = itertools.product(a.families.split(","), a.bases.split(","), a.algorithms.split(","),
                             [float(x) for x in a.lrs.split(",")], [int(x) for x in a.steps.split(",")])
    rows = []
    for family, base, algorithm, lr, steps in grid:
        task = load_task(ROOT / "examples" / "tasks" / f"{family}_v1_{a.budget}.json")
        d = root / f"{family}-{base}-{algorithm}-{lr:g}-{steps}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "job.yaml").write_text(render_job(job_for(family, base, algorithm, lr, steps)))
        t0 = time.time()
        r = run_job(d, task, output_dir=d / "out", warm_workers=True, cache=True, threads=1, progress=False, dry_run=False)
        reward = staged_reward(0, r.outcome(task.budget.max_seconds))
        row = dict(family=family, base=base, algorithm=algorithm, lr=lr, steps=steps, status=r.status,
                   post=r.hidden_score, baseline=r.baseline, reward=round(reward.total, 3),
                   quality=round(reward.quality, 3), seconds=round(time.time() - t0, 1))
        rows.append(row)
        print(json.dumps(row), flush=True)
        if a.jsonl:
            with open(a.jsonl, "a") as fh:
                fh.write(json.dumps(row) + "\n")
    print(f"\nmean reward (valid at the first try) over {len(rows)} jobs: "
          f"{statistics.mean(r['reward'] for r in rows):.3f}")
    for key in ("family", "base", "algorithm", "lr", "steps"):
        groups = defaultdict(list)
        for r in rows:
            groups[r[key]].append(r["reward"])
        print(f"  by {key:9s} " + "  ".join(f"{k}: {statistics.mean(v):.3f}" for k, v in sorted(groups.items())))
    by_pair = defaultdict(list)
    for r in rows:
        by_pair[(r["algorithm"], r["lr"])].append(r["reward"])
    print("  by algorithm x lr " + "  ".join(f"{k[0]} {k[1]:g}: {statistics.mean(v):.3f}"
                                             for k, v in sorted(by_pair.items())))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
