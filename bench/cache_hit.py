"""(e) Job cache: a hit against a rerun of the same job.

One SFT job (tiny-s, calc_chain) run three times through ``run_job``: with the cache on and an empty
cache (a miss: trains, scores, stores), again with the cache on (a hit), and once more with the
cache off (a rerun). The base model's baseline is computed before any timing. Checks that the hit
returns the run's numbers, and prints what the ledger would charge for each.

    .venv/bin/python bench/cache_hit.py                  # 300 steps
    .venv/bin/python bench/cache_hit.py --steps 20       # a quick check
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402


def main() -> None:
    p = C.parser(__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--hidden-n", type=int, default=200)
    a = p.parse_args()
    C.one_thread()
    from agent_trainer.evaluation.baselines import get_baseline
    from agent_trainer.inner_loop.run.job import run_job
    from agent_trainer.inner_loop.models import resolve_model

    wd = C.workdir(a.workdir, "cache")
    task = C.task(hidden_n=a.hidden_n)
    model = resolve_model("tiny-s")
    cache = wd / "cache"
    get_baseline(model, task.family, a.hidden_n, cache_dir=cache)
    job = C.sft_job(wd / "job", a.steps)
    common = dict(task=task, model_dir=model, cache_dir=cache, threads=1, warm_workers=True, progress=False)
    run_job(C.sft_job(wd / "warmup", 2), output_dir=wd / "warmup_out", **{**common, "cache": False})  # start the warm workers

    seconds, results = {}, {}
    for name, use_cache in (("miss", True), ("hit", True), ("rerun", False)):
        with C.clock(seconds, name):
            results[name] = run_job(job, output_dir=wd / name, cache=use_cache, **common)
    r = results
    assert r["miss"].status == "ok" and not r["miss"].cached and r["hit"].cached and not r["rerun"].cached
    same = (r["hit"].hidden_score, r["hit"].loss_curve) == (r["miss"].hidden_score, r["miss"].loss_curve)
    C.table([(k, seconds[k], v.seconds["total"], f"{v.usd:.6f}", v.cached, v.hidden_score) for k, v in r.items()],
            ("run", "wall_s", "charged_s", "charged_usd", "cached", "hidden_score"))
    print(f"hit returns the run's numbers: {same}; the rerun's score: {r['rerun'].hidden_score}")
    claims = [C.ratio("cache_hit_vs_rerun", seconds["hit"] / seconds["rerun"], "<= 0.01")]
    C.write(a.json, "cache_hit", {"args": vars(a), "seconds": seconds, "same_numbers": same,
                                  "charged_seconds": {k: v.seconds["total"] for k, v in r.items()}, "ratios": claims})


if __name__ == "__main__":
    main()
