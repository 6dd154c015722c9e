"""What a scheduler costs: the same inner jobs through local_parallel, SLURM and Ray on this machine.

The same N SFT jobs (seeds 0..N-1, tiny-s, calc_chain, ~30 s each on one thread) run 2 at a time, one torch
thread per job, through ``agent_trainer.inner_loop.run.executor``: ``local_parallel`` (warm workers, as
``hardware=cpu_parallel``), ``slurm`` (a job array on the cluster of ``scripts/cluster.sh slurm``, array
parallelism 2: two tasks, each running its share of the jobs one after another in one process; with
``--engines slurm_per_job`` also one task per job, ``hardware.jobs_per_task=1``) and ``ray`` (tasks of one CPU
on the two-node cluster of ``scripts/cluster.sh ray``: one job on each node). local_parallel runs first and last;
the ratios are against the mean of its two runs, so a drift of the machine's load shows as the gap between them.
Every engine must give the same scores.

    bash scripts/cluster.sh slurm start && bash scripts/cluster.sh ray start
    nice -n 10 .venv/bin/python bench/cluster_overhead.py                 # 8 jobs x 150 steps (~10 min)
    .venv/bin/python bench/cluster_overhead.py --jobs 2 --steps 10        # a quick check
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

CLUSTER_DIR = Path(os.environ.get("CLUSTER_DIR", "/tmp/agent-trainer-cluster"))


def main() -> None:
    p = C.parser(__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--hidden-n", type=int, default=200)
    p.add_argument("--ray-address", default=os.environ.get("RAY_ADDRESS", "127.0.0.1:6389"))
    p.add_argument("--engines", default="slurm,ray", help="which of slurm,slurm_per_job,ray to measure")
    a = p.parse_args()
    C.one_thread()
    os.environ.setdefault("SLURM_CONF", str(CLUSTER_DIR / "slurm" / "slurm.conf"))
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from agent_trainer.inner_loop.run.executor import make_executor
    from agent_trainer.inner_loop.run.job import run_job
    from agent_trainer.inner_loop.run.request import JobRequest

    wd = C.workdir(a.workdir, "cluster")
    task = C.task(hidden_n=a.hidden_n)
    jobs = [C.sft_job(wd / f"job{i}", a.steps, seed=i) for i in range(a.jobs)]
    # the baseline and the local forkserver, before any timing
    run_job(C.sft_job(wd / "warmup", 2), task, threads=1, warm_workers=True, cache=False, progress=False)

    def batch(tag: str) -> list:
        return [JobRequest.of(j, task, wd / tag / j.name, threads=1, warm_workers=True, cache=False, progress=False)
                for j in jobs]

    executors = {
        "local_parallel": lambda: make_executor("local_parallel", max_parallel=2),
        "slurm": lambda: make_executor("slurm", max_parallel=2, folder=wd / "submitit", threads=1),
        "slurm_per_job": lambda: make_executor("slurm", max_parallel=2, folder=wd / "submitit", threads=1,
                                               jobs_per_task=1),
        "ray": lambda: make_executor("ray", max_parallel=2, address=a.ray_address, threads=1, cpus_per_job=1),
    }
    engines = [e for e in a.engines.split(",") if e]
    order = ["local_parallel", *engines, "local_parallel#2"]
    seconds, scores = {}, {}
    for name in order:
        kind = name.split("#")[0]
        ex = executors[kind]()
        if hasattr(ex, "check"):
            ex.check()   # the engine answers (one line naming it otherwise), outside the timing
        with C.clock(seconds, name):
            results = ex.run(batch(name.replace("#", "_")))
        assert all(r.status == "ok" for r in results), [r.detail + r.error for r in results]
        scores[name] = [r.hidden_score for r in results]
        print(f"{name}: {seconds[name]:.1f} s", flush=True)
    local = (seconds["local_parallel"] + seconds["local_parallel#2"]) / 2
    C.table([(k, seconds[k], round(seconds[k] / local, 3), round(seconds[k] / a.jobs, 1), scores[k]) for k in order],
            ("engine", "seconds", "vs_local_parallel", "seconds_per_job", "hidden_scores"))
    print(f"same scores through every engine: {len({tuple(v) for v in scores.values()}) == 1}")
    print(f"local_parallel drift between its two runs: {seconds['local_parallel#2'] / seconds['local_parallel']:.3f}")
    claims = [C.ratio(f"{e}_vs_local_parallel", seconds[e] / local, "<= 1.2") for e in engines]
    C.write(a.json, "cluster_overhead", {"args": {k: str(v) for k, v in vars(a).items()}, "seconds": seconds,
                                         "scores": scores, "ratios": claims})


if __name__ == "__main__":
    main()
