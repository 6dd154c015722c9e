"""How well the cost model predicts the jobs agents write: predicted / measured seconds on a spread of jobs.

    .venv/bin/python bench/cost_model.py                      # the example jobs and a data-family job, ~3 min
    .venv/bin/python bench/cost_model.py --steps 8 --only sft_full grpo_full
    .venv/bin/python bench/cost_model.py --smollm2            # adds the SmolLM2 example jobs (several minutes)
    .venv/bin/python bench/cost_model.py --reprice bench/results/cost_model_quiet.json   # new coefficients, old timings

Each job trains ``--steps`` steps in its own process (``agent_trainer.inner_loop.run.worker``, as jobs run, no
hidden evaluation) and is compared with the estimate this machine's cost model makes for those steps
(``estimate_job(..., wall=True)``: the reference coefficients and this machine's measured profile, if any):
seconds a step (after the first), sampling before training (DPO pairs, self-generated data) and the start-up.
One ``RATIO`` line per job, predicted / measured seconds of the training (sampling and steps), target
within 1.5x either way on a quiet machine; under load the measured side grows and the ratios fall
(``--cpu --threads 1`` measures CPU seconds instead, which the load hardly moves).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

ROOT = _common.ROOT
TASKS = ROOT / "examples" / "tasks"
# (name, job folder, task spec): the example jobs, one per algorithm and PEFT, the data-family job.
JOBS = [
    ("sft_full", ROOT / "examples/jobs/sft_full", TASKS / "calc_chain_v1_fast.json"),
    ("sft_lora", ROOT / "examples/jobs/sft_lora", TASKS / "calc_chain_v1_fast.json"),
    ("grpo_full", ROOT / "examples/jobs/grpo_full", TASKS / "calc_chain_v1_fast.json"),
    ("grpo_lora", ROOT / "examples/jobs/grpo_lora", TASKS / "calc_chain_v1_fast.json"),
    ("dpo_lora", ROOT / "examples/jobs/dpo_lora", TASKS / "calc_chain_v1_fast.json"),
    ("word_math_sft", ROOT / "examples/families/word_math_sft", ROOT / "examples/families/word_math_v1_fast.json"),
]
SMOLLM2_JOBS = [
    ("smollm2_sft_lora", ROOT / "examples/real/sft_lora_smollm2", ROOT / "examples/real/calc_chain_chat_smollm2.json"),
    ("smollm2_grpo_lora", ROOT / "examples/real/grpo_lora_smollm2", ROOT / "examples/real/count_char_raw_smollm2.json"),
]

# Settings an agent may choose that change a step's cost: (name, the example job, task, its job.yaml's changes).
# The cost model prices them (or they are shown to cost nothing) -- else an agent gets compute it is not charged.
VARIANTS = [
    ("grpo_full_beta", ROOT / "examples/jobs/grpo_full", TASKS / "calc_chain_v1_fast.json",
     {"hyperparameters": {"beta": 0.1}}),
    ("grpo_lora_beta", ROOT / "examples/jobs/grpo_lora", TASKS / "calc_chain_v1_fast.json",
     {"hyperparameters": {"beta": 0.1}, "peft": {"init": "default"}}),   # PiSSA has no reference with beta
    ("sft_lora_r256", ROOT / "examples/jobs/sft_lora", TASKS / "calc_chain_v1_fast.json",
     {"peft": {"r": 256, "alpha": 512}}),
    ("sft_lora_pissa", ROOT / "examples/jobs/sft_lora", TASKS / "calc_chain_v1_fast.json",
     {"peft": {"init": "pissa"}}),
]
SMOLLM2_VARIANTS = [
    ("smollm2_sft_lora_r256", ROOT / "examples/real/sft_lora_smollm2",
     ROOT / "examples/real/calc_chain_chat_smollm2.json", {"peft": {"r": 256, "alpha": 512}}),
    ("smollm2_grpo_lora_beta", ROOT / "examples/real/grpo_lora_smollm2",
     ROOT / "examples/real/count_char_raw_smollm2.json", {"hyperparameters": {"beta": 0.1}}),
]


def variant_jobs(variants: list, names=None) -> list[tuple[str, Path, Path]]:
    """(name, job folder, task) of ``variants`` (those in ``names`` when given), each made in a temporary folder."""
    made = Path(tempfile.mkdtemp(prefix="bench-cost-variants-"))
    return [(name, variant_folder(job_dir, changes, made / name), task)
            for name, job_dir, task, changes in variants if names is None or name in names]


def variant_folder(job_dir: Path, changes: dict, into: Path) -> Path:
    """A copy of ``job_dir`` whose job.yaml has ``changes`` merged in (one level of nesting)."""
    import shutil

    import yaml

    shutil.copytree(job_dir, into)
    job = yaml.safe_load((into / "job.yaml").read_text())
    for key, value in changes.items():
        job[key] = {**(job.get(key) or {}), **value} if isinstance(value, dict) else value
    (into / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    return into


def estimate(job_dir: Path, task_path: Path, steps: int):
    """(spec, task, the rows' lengths, the estimate of ``steps`` steps) of one job, as its validation makes it."""
    from agent_trainer.evaluation.tasks import load_task
    from agent_trainer.inner_loop.spec.cost import CostModel, estimate_job, row_tokens
    from agent_trainer.inner_loop.spec.jobspec import load_job
    from agent_trainer.inner_loop.train.data import build_rows_with_origins

    task = load_task(task_path)
    spec = load_job(job_dir, task.family)
    views = spec.stage_specs()
    tokens = [row_tokens(build_rows_with_origins(v, job_dir, task.family)[0], pairs=v.algorithm == "dpo")
              for v in views]   # as the validation
    est = estimate_job(spec, CostModel.measured("cpu"), steps=[min(steps, v.hyperparameters.max_steps) for v in views],
                       prompt_format=task.prompt_format, wall=True, tokens=tokens)
    return spec, task, tokens, est


def predicted(est, steps: int) -> dict:
    return {"predicted_step_s": est.step_seconds, "predicted_sampling_s": est.sampling_seconds,
            "predicted_train_s": round(est.train_seconds(steps), 2), "predicted_startup_s": est.startup_seconds}


def measure(name: str, job_dir: Path, task_path: Path, steps: int, threads: int, work: Path, clock: str) -> dict:
    """Run ``steps`` steps of one job in its own process; the estimate and what was measured."""
    from agent_trainer.evaluation.prompts import for_task
    from agent_trainer.inner_loop.models import resolve_model
    from agent_trainer.inner_loop.run.worker import Training, run_worker

    spec, task, tokens, est = estimate(job_dir, task_path, steps)
    out = work / name
    run = run_worker(Training(job_dir, resolve_model(spec.base_model), task.family, out, max_steps=steps,
                              threads=threads, fmt=for_task(task), spec=spec), deadline_s=3600, progress=False)
    if run.status.get("status") != "ok":
        raise RuntimeError(f"{name} ended {run.status.get('status')}: {run.status.get('detail')} "
                           f"{run.status.get('error', '')[-800:]}")
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines() if line.strip()]
    times = {r["step"]: r[clock] for r in log if clock in r}
    first, last = min(times), max(times)
    step_s = (times[last] - times[first]) / max(1, last - first)
    gen = out / "generation.json"
    sampling_s = sum(g["seconds"] for g in json.loads(gen.read_text())) if gen.is_file() else 0.0
    # The worker's training seconds count its sampling (generation.json) and its steps.
    train_s = step_s * last + sampling_s if clock == "cpu_seconds" else float(run.status.get("seconds") or 0.0)
    return {"job": name, "base_model": spec.base_model, "algorithm": spec.strategy_algorithm(), "steps": last,
            "row_tokens": tokens[0].row, "prompt_tokens": tokens[0].prompt,
            **predicted(est, last), "measured_step_s": round(step_s, 4), "measured_sampling_s": round(sampling_s, 2),
            "measured_train_s": round(train_s, 2), "measured_startup_s": round(run.wall_seconds - train_s, 2)}


def reprice(source: dict) -> list[dict]:
    """The jobs of an earlier run of this bench (its ``--json`` content) with the current cost model's predictions:
    the measured side is that run's, so a change of coefficients is checked without timing anything again."""
    known = {name: (job_dir, task) for name, job_dir, task in JOBS + SMOLLM2_JOBS}
    known.update({name: (job_dir, task) for name, job_dir, task in
                  variant_jobs(VARIANTS + SMOLLM2_VARIANTS, {r["job"] for r in source["jobs"]})})
    rows = source["jobs"]
    for r in rows:
        r.update(predicted(estimate(*known[r["job"]], r["steps"])[3], r["steps"]))
    return rows


def main() -> None:
    p = _common.parser(__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30, help="steps each job trains (default 30)")
    p.add_argument("--threads", type=int, default=2, help="torch threads of each job (default 2, as make run)")
    p.add_argument("--only", nargs="*", default=None, help="these jobs only (names as printed)")
    p.add_argument("--smollm2", action="store_true", help="also the SmolLM2 example jobs (needs at-models import)")
    p.add_argument("--variants", action="store_true",
                   help="also the example jobs with settings that change a step's cost (VARIANTS: GRPO's KL "
                        "reference, a LoRA of rank 256, PiSSA's initialisation; with --smollm2 on SmolLM2 too)")
    p.add_argument("--cpu", action="store_true",
                   help="measure CPU seconds instead of the clock (train_log's cpu_seconds; with --threads 1 they "
                        "stand for a quiet machine's seconds on a busy one)")
    p.add_argument("--reprice", type=Path, default=None, metavar="JSON",
                   help="no jobs run: the measured side of an earlier run's --json file, predicted again with the "
                        "current coefficients")
    a = p.parse_args()
    from agent_trainer.registry import INCLUDE_PATH_ENV

    # The data-family job's family lives in examples/families (task.include_path in a run).
    os.environ[INCLUDE_PATH_ENV] = os.pathsep.join(filter(None, [os.environ.get(INCLUDE_PATH_ENV),
                                                                  str(ROOT / "examples" / "families")]))
    jobs = JOBS + (SMOLLM2_JOBS if a.smollm2 else [])
    if a.variants:
        jobs += variant_jobs(VARIANTS + (SMOLLM2_VARIANTS if a.smollm2 else []))
    jobs = [j for j in jobs if a.only is None or j[0] in a.only]
    if a.reprice:   # the timed run's settings and machine describe the measured side
        source = json.loads(a.reprice.read_text())
        measured = reprice(source)
        settings = {"steps": source.get("steps"), "threads": source.get("threads"), "clock": source.get("clock"),
                    "timed": source.get("machine"), "repriced_from": str(a.reprice)}
    else:
        work = _common.workdir(a.workdir, "cost-model") if a.workdir else Path(tempfile.mkdtemp(prefix="bench-cost-"))
        measured = (measure(name, job_dir, task_path, a.steps, a.threads, work, "cpu_seconds" if a.cpu else "seconds")
                    for name, job_dir, task_path in jobs)
        settings = {"steps": a.steps, "threads": a.threads, "clock": "cpu" if a.cpu else "wall"}
    rows, claims = [], []
    for r in measured:
        name = r["job"]
        rows.append(r)
        ratio = r["predicted_train_s"] / max(1e-9, r["measured_train_s"])
        r["ratio"] = round(ratio, 3)
        ok = 1 / 1.5 <= ratio <= 1.5
        print(f"RATIO cost_model_{name}_predicted_over_measured {ratio:.3f} (target within 1.5x): "
              f"{'PASS' if ok else 'FAIL'}")
        claims.append({"name": f"cost_model_{name}", "value": r["ratio"], "target": "within 1.5x", "pass": ok})
    _common.table([(r["job"], r["base_model"], r["algorithm"], r["steps"], f"{r['row_tokens']:g}",
                    f"{r['predicted_step_s']:.3f}", f"{r['measured_step_s']:.3f}",
                    f"{r['predicted_sampling_s']:.1f}", f"{r['measured_sampling_s']:.1f}",
                    f"{r['predicted_startup_s']:.0f}", f"{r['measured_startup_s']:.0f}", f"{r['ratio']:.2f}")
                   for r in rows],
                  ("job", "base", "algorithm", "steps", "row tokens", "step s pred", "step s meas", "sampling pred",
                   "sampling meas", "start-up pred", "start-up meas", "train pred/meas"))
    print(f"within 1.5x: {sum(c['pass'] for c in claims)} of {len(claims)} jobs")
    _common.write(a.json, "cost_model", {"jobs": rows, "claims": claims, **settings})


if __name__ == "__main__":
    main()
