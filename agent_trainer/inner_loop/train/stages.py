"""Run a whole job in the job's process: its stages in order, each from the model the previous one saved.

    ran = {"stages": []}
    job = JobContext(job_dir, "calc_chain", out)
    status = run_stages(spec, base_dir, job, JobBudget(max_steps=400, max_compute=75, stage_costs=[(0.3, 0.0)]),
                        ran=ran)
    status["status"], ran      # "ok", {"stages": [{"algorithm": "sft", "peft": "full", ...}, ...]}

``JobBudget`` plans each stage's budget from what the earlier ones spent; ``run_stage`` runs one stage.

Runs agent code (rewards): call it in the job's process only (``agent_trainer.inner_loop.run.worker``). The stages'
budget, outputs and ``ran``: docs/jobs.md, "Strategy space".
"""

from __future__ import annotations

import gc
import json
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from agent_trainer.inner_loop.train.data import (TRAINED_ROWS, build_rows_with_origins, data_source_label, source_items,
                             trained_record)
from agent_trainer.inner_loop.spec.jobspec import JobSpec
from agent_trainer.inner_loop.train.callbacks import StepLog
from agent_trainer.inner_loop.train.config import planned_steps
from agent_trainer.inner_loop.train.train import MODEL_DIR, TRAIN_LOG, TRL_CONFIG, train

GENERATION_FILE = "generation.json"


def _load(model_path: Path, device: str = "cpu"):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, local_files_only=True)
    return model.to(device), tokenizer


def prepare_stage(spec: JobSpec, job_dir: Path, model_path: Path, family: str, deadline: float | None = None,
                  device: str = "cpu"):
    """``(rows, training rewards, data_source, generation stats)`` of one single-stage spec (sampling on ``device``)."""
    from agent_trainer.inner_loop.train.rewards import resolve_rewards
    from agent_trainer.inner_loop.train.selfgen import SelfGenError, ranking_rewards, rejection_sample

    selfgen = [i for i, s in enumerate(spec.data.sources) if s.self_generated is not None]
    rewards = resolve_rewards(spec, job_dir) if spec.algorithm == "grpo" else []
    needs_model = bool(selfgen) or spec.algorithm == "dpo"
    ranking = ranking_rewards(spec, job_dir, family) if needs_model else []
    model = tokenizer = None
    stats = []
    generated = None
    try:
        if needs_model:
            model, tokenizer = _load(model_path, device)
        if selfgen:
            generated = {}
            for i in selfgen:
                src = spec.data.sources[i]
                kept, st = rejection_sample(model, tokenizer, source_items(src), src.self_generated, ranking,
                                            seed=spec.seed + i, deadline=deadline)
                stats.append(st)
                if not kept:
                    raise SelfGenError(
                        f"data.sources.{i}: none of the model's {st.samples} samples of {st.prompts} prompts reached "
                        f"min_reward {src.self_generated.min_reward:g}; lower min_reward, raise samples_per_prompt "
                        "or temperature, or train on curated data first (stages)")
                generated[i] = kept
        rows, origins = build_rows_with_origins(spec, job_dir, family, generated)
        if spec.algorithm == "dpo":
            rows, origins, st = _pairs(spec, rows, origins, model, tokenizer, ranking, deadline)
            if st is not None:
                stats.append(st)
    finally:
        del model, tokenizer
        gc.collect()
    return rows, rewards, data_source_label(origins), stats


def _pairs(spec, rows, origins, model, tokenizer, ranking, deadline):
    """DPO rows: the agent's own pairs (``data.file``) plus (best, worst) pairs of the model's samples."""
    from agent_trainer.inner_loop.train.selfgen import SelfGenError, preference_pairs

    agent = [r for r, o in zip(rows, origins) if o == "agent"]
    bad = [r["prompt"] for r in agent if not (isinstance(r.get("chosen"), str) and isinstance(r.get("rejected"), str))]
    if bad:
        raise ValueError(f"{len(bad)} rows of data.file have no chosen/rejected strings (e.g. {bad[0]!r}); a dpo "
                         "data file holds the agent's own pairs: prompt, answer, chosen, rejected")
    prompts = [r for r, o in zip(rows, origins) if o != "agent"]
    pairs, st = (preference_pairs(model, tokenizer, prompts, spec.hyperparameters, ranking, seed=spec.seed,
                                  deadline=deadline) if prompts else ([], None))
    if not agent and not pairs:
        raise SelfGenError(f"no preference pair: the {st.samples} samples of each of {st.prompts} prompts all got the "
                           "same reward; use a partial-credit reward (numeric_closeness, token_overlap), more "
                           "num_generations or a higher temperature")
    labelled = [("agent", {**r}) for r in agent] + [("self_generated", p) for p in pairs]
    random.Random(f"pairs/{spec.seed}").shuffle(labelled)
    return [r for _, r in labelled], [o for o, _ in labelled], st


def _write_rows(path: Path, rows: list[dict]) -> None:
    """The rows this stage trains on, as the harness checks them after training
    (``agent_trainer.inner_loop.isolation.contamination``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in trained_record(rows):
            f.write(json.dumps(row) + "\n")


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


@dataclass(frozen=True)
class JobContext:
    """What every stage of a job shares: the job's folder (its data and reward files), its task family, the output
    folder, and how it trains. ``device``: ``cpu`` or ``cuda`` (resolved: ``runners.config.resolve_device``), for
    the training and the self-generated data's sampling; ``vllm``: GRPO stages generate with vLLM (``trl_config``);
    ``fmt``: the task's prompt format (``agent_trainer.evaluation.prompts``): rows train in it (self-generated
    samples are drawn from the raw prompts)."""

    job_dir: Path
    family: str
    output_dir: Path
    device: str = "cpu"
    vllm: bool = False
    fmt: Any = None


@dataclass(frozen=True)
class StageBudget:
    """What one stage may spend: the job's steps still left, the compute seconds of its training (None: steps
    only), and the estimate's compute seconds of one of its steps and of its data generation."""

    steps: int
    compute: float | None
    step_compute: float = 0.0
    sample_compute: float = 0.0


@dataclass
class JobBudget:
    """The job's budget, planned stage by stage: ``max_steps`` and ``max_compute`` compute seconds (None: steps
    only), shared by the stages by their ``budget_share``. ``stage_costs``: each stage's (compute seconds a step,
    compute seconds of sampling), from the harness's estimate (``agent_trainer.inner_loop.spec.cost.CostEstimate
    .stages``). Both are counted, never timed: a stage stops at the same step on any machine under any load.

        >>> budget = JobBudget(max_steps=400, max_compute=75.0, stage_costs=[(0.3, 0.0)])
        >>> stage = budget.stage(0, shares=[1.0])      # StageBudget(steps=400, compute=75.0, ...)
        >>> budget.spend(stage, steps=120)             # what the stage ran; the next stage plans from the rest
    """

    max_steps: int
    max_compute: float | None = None
    stage_costs: list = field(default_factory=list)
    steps_used: int = 0
    compute_used: float = 0.0

    def stage(self, i: int, shares: list[float]) -> StageBudget:
        """Stage ``i``'s budget: the steps left, and its share of the compute left less what its sampling costs."""
        step_compute, sample_compute = self.stage_costs[i] if i < len(self.stage_costs) else (0.0, 0.0)
        compute = (None if self.max_compute is None
                   else max(0.0, max(0.0, self.max_compute - self.compute_used) * shares[i] / sum(shares[i:])
                            - sample_compute))
        return StageBudget(self.max_steps - self.steps_used, compute, step_compute, sample_compute)

    def spend(self, stage: StageBudget, steps: int) -> None:
        """Count a stage that ran ``steps`` steps (its sampling and its steps at the estimate's compute)."""
        self.steps_used += steps
        self.compute_used += stage.sample_compute + steps * stage.step_compute

    def planned_steps(self, later_steps: int, running: int = 0) -> int:
        """The job's steps as planned now: those used, ``running`` of the stage under way, and the later stages'
        ``later_steps`` as far as the steps left allow."""
        return self.steps_used + running + max(0, min(later_steps, self.max_steps - self.steps_used - running))


def run_stages(spec: JobSpec, model_path: str | Path, job: JobContext, budget: JobBudget, *,
               ran: dict | None = None, on_update: Callable[[dict], None] | None = None) -> dict:
    """Train every stage of ``spec`` in order, each from the model the previous one saved, within ``budget``;
    returns the final status fields (see the module docstring).

    ``ran`` (``{"stages": []}``) is filled as stages start and end; ``on_update`` gets
    ``{"planned_steps", "ran"}`` at each of those moments (the worker writes it to its status file).
    """
    job.output_dir.mkdir(parents=True, exist_ok=True)
    ran = ran if ran is not None else {"stages": []}
    notify = on_update or (lambda update: None)
    views, shares = spec.stage_specs(), spec.budget_shares()
    multi = len(views) > 1
    if multi:
        for stale in job.output_dir.glob("stage_*"):
            shutil.rmtree(stale, ignore_errors=True)
        (job.output_dir / TRAIN_LOG).write_text("")
    current = Path(model_path)
    stages: list[dict] = []
    configs: dict = {}
    for i, view in enumerate(views):
        stage = budget.stage(i, shares)
        if stage.steps <= 0:
            stages.append({"status": "timeout", "steps": 0, "planned_steps": 0, "seconds": 0.0,
                           "detail": "the task's step budget was spent by the earlier stages; not run"})
            break
        later = sum(v.hyperparameters.max_steps for v in views[i + 1:])

        def started(entry: dict, planned: int) -> None:
            ran["stages"].append(entry)
            notify({"planned_steps": budget.planned_steps(later, running=planned), "ran": ran})

        stage_out = job.output_dir / f"stage_{i + 1}" if multi else job.output_dir
        log = (StepLog(job.output_dir / TRAIN_LOG, clock=None, append=True, step_offset=budget.steps_used,
                       fields={"stage": i + 1}) if multi else None)
        result, report = run_stage(view, current, stage_out, job, stage, log=log, started=started)
        budget.spend(stage, report.steps)
        stages.append(result)
        if multi:
            configs[f"stage_{i + 1}"] = json.loads((stage_out / TRL_CONFIG).read_text())
            _write_json(job.output_dir / TRL_CONFIG, configs)
            if i > 0 and current != Path(model_path):
                shutil.rmtree(current, ignore_errors=True)  # the stage that trained from it is done
        notify({"planned_steps": budget.planned_steps(later), "ran": ran})
        if report.status == "diverged" or report.model_dir is None:
            break
        current = Path(report.model_dir)
    return _merge(stages, job.output_dir, current if multi else None)


def run_stage(view: JobSpec, model_path: Path, stage_out: Path, job: JobContext, budget: StageBudget, *,
              log: StepLog | None = None, started: Callable[[dict, int], None] = lambda entry, planned: None):
    """Prepare and train one single-stage spec from ``model_path`` into ``stage_out``; returns ``(its status
    fields, the training's report)``. ``started(entry, planned steps)`` is called once its rows are known, before
    training (``entry``, its ``ran`` record, gets the steps it ran at the end)."""
    rows, rewards, source, gen = prepare_stage(view, job.job_dir, model_path, job.family, device=job.device)
    if gen:
        _write_json(stage_out / GENERATION_FILE, [g.as_dict() for g in gen])
    _write_rows(stage_out / TRAINED_ROWS, rows)
    entry = {"algorithm": view.algorithm, "peft": "lora" if view.peft else "full", "data_source": source, "steps": 0}
    started(entry, planned_steps(view, len(rows), budget.steps))
    report = train(view, rows, rewards, model_path, stage_out, max_steps=budget.steps, max_compute=budget.compute,
                   step_compute=budget.step_compute, log=log, device=job.device, vllm=job.vllm, fmt=job.fmt)
    entry["steps"] = report.steps
    detail = "; ".join(filter(None, [g.summary() for g in gen] + [report.detail]))
    result = {**report.as_dict(), "seconds": round(report.seconds + sum(g.seconds for g in gen), 3),
              "detail": detail, "generation": [g.as_dict() for g in gen], "data_source": source}
    return result, report


def _merge(stages: list[dict], output_dir: Path, last_model: Path | None) -> dict:
    """The job's status from its stages' reports (the single stage's report for a single-stage job)."""
    statuses = [s["status"] for s in stages]
    status = "diverged" if "diverged" in statuses else "timeout" if "timeout" in statuses else "ok"
    last = stages[-1]
    out = {"status": status, "steps": sum(s["steps"] for s in stages),
           "planned_steps": sum(s["planned_steps"] for s in stages),
           "seconds": round(sum(s["seconds"] for s in stages), 3), "final_loss": last.get("final_loss"),
           "final_reward": last.get("final_reward"), "trainable_params": last.get("trainable_params", 0),
           "model_dir": None, "stages": stages}
    if len(stages) == 1 and last_model is None:
        out["detail"], out["model_dir"] = last["detail"], last.get("model_dir")
        return out
    out["detail"] = "; ".join(f"stage {n}: {s['detail']}" for n, s in enumerate(stages, 1) if s["detail"])
    if status != "diverged" and last_model is not None and last_model.is_dir() and last_model.name == MODEL_DIR:
        final = output_dir / MODEL_DIR
        shutil.rmtree(final, ignore_errors=True)
        shutil.move(str(last_model), str(final))
        out["model_dir"] = str(final)
    return out
