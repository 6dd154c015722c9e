"""People's jobs: the hand-written example jobs (``examples/jobs/*``) as a person would copy them onto a task, and
the choice of the best one per family on a validation split of the family's training pool, never the hidden set.

    >>> files = adapt_job("examples/jobs/sft_full", task)     # {"job.yaml": ..., any other file of the folder}
    >>> chosen = choose_jobs(candidate_jobs(), tasks, job_settings, executor, out / "handwritten")
    >>> chosen["calc_chain"]["chosen"], chosen["calc_chain"]["scores"]["sft_full"]["validation"]

The copy: the data sources' ``family`` is the task's, and ``max_steps`` fits the task's step budget (a job over it
is scaled down; a job's stages shrink together); nothing else changes. The split: ``VALIDATION_SIZE`` items of the
training pool drawn from seed ``VALIDATION_SEED`` (the seed the examples' settings were chosen on:
docs/results/2026-12-01-example-jobs.md) that are neither in the base models' pretraining stream nor in any
candidate's data, so a job that memorised its rows gains nothing there. Each candidate runs once per family
through the run's executor and job cache (an episode that writes the same job later is served from the cache);
the hidden score each job also gets is not read here.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import yaml

from agent_trainer.paths import PROJECT_ROOT

EXAMPLES = PROJECT_ROOT / "examples" / "jobs"
VALIDATION_SEED = 777
VALIDATION_SIZE = 200


def candidate_jobs(folders: Sequence[str | Path] = ()) -> list[Path]:
    """The job folders to choose among: ``folders``, or every folder of ``examples/jobs`` with a ``job.yaml``."""
    from agent_trainer.cli_args import UserError
    from agent_trainer.paths import resolve_path

    out = [resolve_path(f) for f in folders] if folders else sorted(p.parent for p in EXAMPLES.glob("*/job.yaml"))
    missing = [str(p) for p in out if not (p / "job.yaml").is_file()]
    if missing:
        raise UserError(f"not a job folder (no job.yaml): {', '.join(missing)}")
    return out


def _sources(raw: dict) -> list[dict]:
    parts = [raw, *(raw.get("stages") or [])]
    return [s for p in parts for s in ((p.get("data") or {}).get("sources") or []) if isinstance(s, dict)]


def adapt_job(folder: str | Path, task) -> dict[str, str]:
    """The files of job ``folder`` as copied onto ``task``: ``job.yaml`` with the task's family and step budget,
    the folder's other files unchanged."""
    folder = Path(folder)
    raw = yaml.safe_load((folder / "job.yaml").read_text())
    for src in _sources(raw):
        if "family" in src:
            src["family"] = task.family
    budget = task.budget.max_steps
    hps = [st.setdefault("hyperparameters", {}) for st in raw["stages"]] if raw.get("stages") else \
        [raw.setdefault("hyperparameters", {})]
    total = sum(int(hp.get("max_steps", 0)) for hp in hps)
    if total > budget:
        for hp in hps:
            if "max_steps" in hp:
                hp["max_steps"] = max(1, math.floor(hp["max_steps"] * budget / total))
    files = {"job.yaml": yaml.safe_dump(raw, sort_keys=False, width=120)}
    files.update({p.name: p.read_text() for p in sorted(folder.iterdir()) if p.is_file() and p.name != "job.yaml"})
    return files


def validation_split(family: str, exclude_prompts: set[str], n: int = VALIDATION_SIZE) -> list:
    """``n`` training-pool items of ``family`` from ``VALIDATION_SEED``, none in the tiny models' pretraining
    stream nor in ``exclude_prompts`` (fewer when the pool runs out of such items within many draws)."""
    from agent_trainer.evaluation.families import get_family
    from agent_trainer.inner_loop.models.build import TINY_M, TINY_S, pretraining_rows

    fam = get_family(family)
    seen = set(exclude_prompts) | {p for cfg in (TINY_S, TINY_M) for p, _ in pretraining_rows(cfg, 0)}
    out, kept, stream = [], set(), fam.training_stream(VALIDATION_SEED)
    for _ in range(200 * n):
        ex = next(stream)
        if ex.prompt not in seen and ex.prompt not in kept:
            kept.add(ex.prompt)
            out.append(ex)
            if len(out) == n:
                break
    return out


def job_data_prompts(family: str, files: dict[str, str]) -> set[str]:
    """The prompts of the training-pool rows a job's sources draw (``seed``, ``size``) for ``family``."""
    from agent_trainer.evaluation.families import get_family

    fam = get_family(family)
    out: set[str] = set()
    for src in _sources(yaml.safe_load(files["job.yaml"])):
        out |= {e.prompt for e in fam.training_examples(int(src.get("seed", 0)), int(src.get("size", 1000)))}
    return out


def score_on_split(model_dir: Path, task, examples: list) -> float:
    """The mean score of the model in ``model_dir`` on ``examples`` (greedy, the task's prompt format)."""
    from agent_trainer.evaluation.families import get_family
    from agent_trainer.evaluation.hidden_eval import load_checkpoint, score_examples
    from agent_trainer.evaluation.prompts import for_task

    model, tokenizer = load_checkpoint(model_dir)
    return score_examples(model, tokenizer, get_family(task.family), examples, fmt=for_task(task))[0]


def choose_jobs(candidates: Sequence[Path], tasks: Sequence, settings, executor, out: Path,
                note=print) -> dict[str, dict[str, Any]]:
    """Per task's family: each candidate copied onto the task, run, and scored on the family's validation split;
    the chosen one (best validation score; the first listed on a tie), why, and every candidate's figures."""
    from agent_trainer.inner_loop.models import resolve_model
    from agent_trainer.inner_loop.run.job import run_request
    from agent_trainer.inner_loop.run.request import JobRequest

    result: dict[str, dict[str, Any]] = {}
    for task in tasks:
        copies = {Path(c).name: adapt_job(c, task) for c in candidates}
        split = validation_split(task.family, set().union(*(job_data_prompts(task.family, f)
                                                            for f in copies.values())))
        requests = []
        for name, files in copies.items():
            job_dir = out / task.family / name / "job"
            job_dir.mkdir(parents=True, exist_ok=True)
            for path, text in files.items():
                (job_dir / path).write_text(text)
            requests.append(JobRequest(job_dir, task, job_dir.parent / "output", settings))
        note(f"{task.family}: {len(requests)} example jobs, scored on {len(split)} validation items ...")
        results = executor.run(requests) if executor is not None else [run_request(r) for r in requests]
        scores: dict[str, dict[str, Any]] = {}
        for name, res in zip(copies, results):
            row: dict[str, Any] = {"status": res.status, "base_model": res.base_model}
            model = Path(res.cached_from or res.output_dir) / "model"
            if res.status in ("ok", "timeout") and not res.flagged and model.is_dir():
                row["validation"] = score_on_split(model, task, split)
            scores[name] = row
        bases = {m: score_on_split(resolve_model(m), task, split)
                 for m in sorted({r["base_model"] for r in scores.values() if r.get("base_model")})}
        for row in scores.values():
            if "validation" in row:
                row["validation_uplift"] = row["validation"] - bases[row["base_model"]]
        ran = {n: r for n, r in scores.items() if "validation_uplift" in r}
        if not ran:
            statuses = ", ".join(f"{n} {r['status']}" for n, r in scores.items())
            raise ValueError(f"{task.family}: no example job ran ({statuses})")
        best = max(ran, key=lambda n: ran[n]["validation_uplift"])
        result[task.family] = {
            "chosen": best, "validation_items": len(split), "base_validation": bases, "scores": scores,
            "why": f"the best validation uplift of {len(ran)} example jobs that ran "
                   f"({ran[best]['validation_uplift']:+.3f} on {len(split)} training-pool items)"}
        note(f"{task.family}: {best} ({result[task.family]['why']})")
    return result
