"""(a) Harness overhead: ``at-job`` against a plain TRL script doing the same training and evaluation.

The job is an SFT of tiny-s on calc_chain (like examples/jobs/sft_full); the plain script
(bench/plain_trl.py) trains on the very rows the job builds, with the same TRL settings and seed, and
scores the same hidden items with batched greedy decoding. Two comparisons, measured side by side:

- cold: each side is a fresh process (``at-job`` command vs ``python bench/plain_trl.py``): the price
  of validation, the dry run, the child process, the budget guard, the checkpoint check and scoring,
  imports included on both sides;
- warm: both in this process after a warm-up (how ``at-train`` runs job after job: warm workers).

One torch thread per side. The baseline score is computed before timing (it is cached once per model).

    .venv/bin/python bench/harness_overhead.py                      # 400 steps, 200 hidden items
    .venv/bin/python bench/harness_overhead.py --steps 20 --hidden-n 64 --repeats 1   # a quick check
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402


def main() -> None:
    p = C.parser(__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--hidden-n", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3, help="runs per side and mode (the median is reported)")
    p.add_argument("--skip-warm", action="store_true")
    a = p.parse_args()
    C.one_thread()
    from agent_trainer.evaluation.baselines import get_baseline
    from agent_trainer.evaluation.hidden_eval import hidden_set
    from agent_trainer.inner_loop.train.data import build_rows
    from agent_trainer.inner_loop.spec.jobspec import load_job
    from agent_trainer.inner_loop.models import resolve_model

    wd = C.workdir(a.workdir, "overhead")
    task = C.task(hidden_n=a.hidden_n)
    job = C.sft_job(wd / "job", a.steps)
    model = resolve_model("tiny-s")
    rows = build_rows(load_job(job), job, default_family=task.family)
    (wd / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (wd / "eval.jsonl").write_text("".join(json.dumps({"prompt": e.prompt, "answer": e.answer}) + "\n"
                                           for e in hidden_set(task.family, a.hidden_n)))
    get_baseline(model, task.family, a.hidden_n)  # cached once per model: not part of either side
    bin_dir = Path(sys.executable).parent

    def plain_cold(i: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, str(C.ROOT / "bench" / "plain_trl.py"), "--model", str(model),
                              "--rows", str(wd / "rows.jsonl"), "--eval", str(wd / "eval.jsonl"), "--steps",
                              str(a.steps), "--threads", "1", "--out", str(wd / f"plain{i}")],
                             capture_output=True, text=True, check=True)
        return time.perf_counter() - t0, json.loads(out.stdout.strip().splitlines()[-1])["score"]

    def atjob_cold(i: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        subprocess.run([str(bin_dir / "at-job"), str(job), f"task={C.TASK_SPEC}", f"inner.eval_size={a.hidden_n}",
                        "tracking=off", f"runs_dir={wd / 'runs'}", f"run_id=cold{i}", "hardware.threads_per_job=1",
                        "inner.cache=false"], capture_output=True, text=True, check=True, cwd=C.ROOT)
        wall = time.perf_counter() - t0
        return wall, json.loads((wd / "runs" / f"cold{i}" / "job" / "result.json").read_text())["hidden_score"]

    results: dict[str, list] = {"plain_cold": [], "atjob_cold": [], "plain_warm": [], "atjob_warm": []}
    scores: dict[str, float] = {}
    for i in range(a.repeats):  # alternate the sides so that load changes hit both
        for name, fn in (("plain_cold", plain_cold), ("atjob_cold", atjob_cold)):
            wall, score = fn(i)
            results[name].append(round(wall, 3))
            scores[name] = score

    if not a.skip_warm:
        sys.path.insert(0, str(C.ROOT / "bench"))
        from plain_trl import train_and_eval

        from agent_trainer.inner_loop.run.job import run_job

        items = [json.loads(x) for x in (wd / "eval.jsonl").read_text().splitlines()]
        warm_job = C.sft_job(wd / "warmup_job", 2)
        run_job(warm_job, task, threads=1, warm_workers=True, cache=False, progress=False, output_dir=wd / "warmup_out")
        train_and_eval(str(model), rows[:128], items[:8], steps=2, out=str(wd / "plain_warmup"))
        for i in range(a.repeats):
            t0 = time.perf_counter()
            r = train_and_eval(str(model), rows, items, steps=a.steps, out=str(wd / f"plain_warm{i}"))
            results["plain_warm"].append(round(time.perf_counter() - t0, 3))
            scores["plain_warm"] = r["score"]
            t0 = time.perf_counter()
            res = run_job(job, task, threads=1, warm_workers=True, cache=False, progress=False, output_dir=wd / f"warm{i}")
            results["atjob_warm"].append(round(time.perf_counter() - t0, 3))
            scores["atjob_warm"] = res.hidden_score
            assert res.status == "ok", res.detail

    med = {k: statistics.median(v) for k, v in results.items() if v}
    C.table([(k, med[k], results[k], f"{scores[k]:.4f}") for k in med],
            ("side", "median_s", "runs_s", "hidden_score"))
    claims = [C.ratio("harness_overhead_cold", med["atjob_cold"] / med["plain_cold"], "<= 1.15")]
    if "atjob_warm" in med:
        claims.append(C.ratio("harness_overhead_warm", med["atjob_warm"] / med["plain_warm"], "<= 1.15"))
    C.write(a.json, "harness_overhead", {"args": vars(a), "seconds": results, "median": med, "scores": scores,
                                         "ratios": claims})


if __name__ == "__main__":
    main()
