"""``at-job``: validate, train and score one job folder, the way an agent's submission is run.

    at-job examples/jobs/sft_full task=examples/tasks/calc_chain_v1_fast.json
    at-job examples/jobs/grpo_lora task=calc_chain_v1_fast inner.sandbox=false
    at-job examples/jobs/sft_full dry_run=true        # resolved config only

The job's own files are never changed: the run folder (runs/<run_id>/) receives the
job's outputs and ``result.json``. Returns the hidden score of the trained model.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from agent_trainer import cli
from agent_trainer.config import CONFIG_DIR, typed
from agent_trainer.paths import resolve_path
from agent_trainer.tracking import check_reachable
from agent_trainer.commands._errors import user_errors


def _task_family(cfg: DictConfig) -> str | None:
    """The task's family, or None when the task cannot be read (``cli.start_run`` then says why)."""
    from agent_trainer.evaluation.tasks import load_task

    try:
        return load_task(resolve_path(cfg.task.spec_path)).family
    except Exception:
        return None


def run(cfg: DictConfig) -> float | None:
    """Run the job folder ``cfg.job_dir`` on ``cfg.task.spec_path``; print the result, return the hidden score."""
    job_dir = resolve_path(cfg.job_dir)
    if not cfg.dry_run and cfg.inner.warm_workers and (job_dir / "job.yaml").is_file():
        from agent_trainer.inner_loop.run.job import prestart_warm_worker
        from agent_trainer.kernels import use_cpu_kernels

        use_cpu_kernels(typed(cfg).hardware.cpu_kernels)   # the warm worker starts with the run's kernels

        # The warm worker's imports (~9 s of TRL) start now, beside everything else this command does
        # before training (config, run folder, validation's model load), not after it.
        prestart_warm_worker(job_dir, _task_family(cfg))
    folder, conf = cli.open_run(cfg)
    if cfg.dry_run:
        return None
    check_reachable(cfg)  # a closed MLflow server fails here, in seconds
    if not (job_dir / "job.yaml").is_file():
        raise cli.UserError(f"{cfg.job_dir!r} is not a job folder (no job.yaml); e.g. at-job examples/jobs/sft_full")
    from agent_trainer.commands._task_specs import check_answer_room
    from agent_trainer.evaluation.tasks import load_task
    from agent_trainer.inner_loop.run.job import run_request
    from agent_trainer.inner_loop.run.request import JobRequest, JobSettings

    spec = load_task(resolve_path(cfg.task.spec_path))
    check_answer_room(conf, [spec])   # a family no model here could score stops before the job trains
    with cli.tracker(cfg, "at-job", tags={"job_dir": str(job_dir)}) as tr:
        tr.log_config(cfg)
        settings = JobSettings.from_config(conf, tracker=tr)
        result = run_request(JobRequest(job_dir, spec, folder / "job", settings))
    cli.print_kv({
        "status": result.status, "detail": result.detail, "task": result.task, "base_model": result.base_model,
        "algorithm": result.algorithm, "steps": f"{result.steps}/{result.planned_steps}",
        "hidden_score": _fmt(result.hidden_score), "baseline": _fmt(result.baseline), "uplift": _fmt(result.uplift),
        "seconds": f"{result.seconds['total']:.1f}", "usd": f"{result.usd:.5f}", "device": result.device or "-",
        "output": result.output_dir,
        **({"cached": "yes, the stored result of an identical job (inner.cache=false reruns it)"}
           if getattr(result, "cached", False) else {}),
    })
    for finding in result.findings:
        hint = f" ({finding['hint']})" if finding.get("hint") else ""
        print(f"  {finding.get('severity')} {finding.get('field')}: {finding.get('message')}{hint}")
    return result.hidden_score


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


@hydra.main(config_path=str(CONFIG_DIR), config_name="job", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> float | None:
    return cli.call(run, cfg, user_errors=user_errors, value_name="hidden_score")


def main() -> None:
    cli.main(_hydra_main, "job", positional="job_dir")


if __name__ == "__main__":
    main()
