"""(c) N inner jobs in parallel against in sequence (throughput), one torch thread per job.

The same N SFT jobs (seeds 0..N-1, tiny-s, calc_chain) run through ``agent_trainer.inner_loop.run.executor``:
``sequential`` with one thread per job, ``local_parallel`` (N at once, one thread each), and, for
reference, ``sequential`` with all cores per job. Warm workers on, job cache off; a 2-step job
starts the warm-worker forkserver before any timing. Checks that every mode gives the same scores.

    .venv/bin/python bench/parallel_jobs.py                   # 2 jobs x 300 steps
    .venv/bin/python bench/parallel_jobs.py --steps 20        # a quick check
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402


def main() -> None:
    p = C.parser(__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--hidden-n", type=int, default=200)
    p.add_argument("--skip-all-cores", action="store_true", help="skip the sequential run with all cores per job")
    a = p.parse_args()
    C.one_thread()
    from agent_trainer.inner_loop.run.executor import make_executor
    from agent_trainer.inner_loop.run.job import run_job

    wd = C.workdir(a.workdir, "parallel")
    task = C.task(hidden_n=a.hidden_n)
    jobs = [C.sft_job(wd / f"job{i}", a.steps, seed=i) for i in range(a.jobs)]
    # the forkserver and the baseline, before any timing
    run_job(C.sft_job(wd / "warmup", 2), task, threads=1, warm_workers=True, cache=False, progress=False)

    def batch(tag: str, threads: int) -> list[dict]:
        return [dict(job_dir=j, task=task, output_dir=wd / tag / j.name, threads=threads, warm_workers=True,
                     cache=False, progress=False) for j in jobs]

    modes = [("sequential_1thread", "sequential", 1, 1), ("parallel_1thread", "local_parallel", a.jobs, 1)]
    if not a.skip_all_cores:
        modes.append(("sequential_all_cores", "sequential", 1, os.cpu_count() or 1))
    seconds, scores = {}, {}
    for name, kind, par, threads in modes:
        with C.clock(seconds, name):
            results = make_executor(kind, max_parallel=par).run(batch(name, threads))
        assert all(r.status == "ok" for r in results), [r.detail for r in results]
        scores[name] = [r.hidden_score for r in results]
    C.table([(k, seconds[k], round(a.jobs * 3600 / seconds[k], 1), scores[k]) for k in seconds],
            ("mode", "seconds", "jobs_per_hour", "hidden_scores"))
    print(f"same scores in every mode: {len({tuple(v) for v in scores.values()}) == 1}")
    claims = [C.ratio("parallel_throughput_vs_sequential", seconds["sequential_1thread"] / seconds["parallel_1thread"],
                      ">= 1.6")]
    if "sequential_all_cores" in seconds:
        claims.append(C.ratio("parallel_throughput_vs_sequential_all_cores",
                              seconds["sequential_all_cores"] / seconds["parallel_1thread"], ">= 1.0"))
    C.write(a.json, "parallel_jobs", {"args": vars(a), "seconds": seconds, "scores": scores, "ratios": claims})


if __name__ == "__main__":
    main()
