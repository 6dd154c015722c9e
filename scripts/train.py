"""``at-train``: reinforcement learning of the agent that writes training jobs (the main job).

    at-train                                   # experiment=cpu_default: tiny agent, tiny models, CPU
    at-train experiment=smoke                  # a couple of minutes, for tests
    at-train experiment=seed_scale dry_run=true   # the published setting (GPU): resolved config only
    at-train resume=true                       # continue the newest run after its last complete step

Writes ``runs/<run_id>/``: checkpoints, episodes, metrics.jsonl, ledger.jsonl, plots/*.png; MLflow
holds one parent run with per-step metrics. Returns the mean reward of the last steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import hydra
from omegaconf import DictConfig

from agent_trainer import cli
from agent_trainer.config import CONFIG_DIR
from agent_trainer.tracking import Tracker, check_reachable
from scripts._errors import user_errors

RUN_MARKER = "outer_run.json"


def resume_folder(cfg: DictConfig, folder: Path) -> Path | None:
    """The run folder to continue (``resume=true``: the newest outer run in runs_dir), or None."""
    value = str(cfg.resume).strip()
    if value.lower() in ("false", "no", "0", ""):
        return None
    if value.lower() in ("true", "yes", "1"):
        runs = sorted((p.parent for p in Path(str(cfg.runs_dir)).glob(f"*/{RUN_MARKER}") if p.parent != folder),
                      key=lambda p: (p / RUN_MARKER).stat().st_mtime)
        if not runs:
            raise cli.UserError(f"resume=true: no earlier at-train run in {cfg.runs_dir}; start one without resume")
        return runs[-1]
    path = Path(value)
    if not (path / RUN_MARKER).is_file():
        raise cli.UserError(f"resume={value}: not an at-train run folder (no {RUN_MARKER})")
    return path


def run(cfg: DictConfig) -> float | None:
    """Train (or resume) on ``cfg``; returns the mean reward over the last 3 steps."""
    folder = cli.start_run(cfg)
    if cfg.dry_run:
        from outer_loop.run_config import execution_plan

        # Builds every setting object and the executor: a dry run fails where a real run would.
        plan = execution_plan(cfg)
        (folder / "plan.json").write_text(json.dumps(plan, indent=2, default=str) + "\n")
        cli.print_kv({k: v for k, v in plan.items() if k != "sbatch"})
        if plan.get("sbatch"):
            print("sbatch script of one outer step's batch:\n" + plan["sbatch"])
        return None
    check_reachable(cfg)  # a closed MLflow server fails here, in seconds
    previous = resume_folder(cfg, folder)  # before the heavy imports: a missing run is reported at once
    from outer_loop.run_config import build_trainer, quiet_libraries

    quiet_libraries()  # one progress bar (outer steps), not one per model load and inner job
    run_dir = previous or folder
    marker = run_dir / RUN_MARKER
    state = json.loads(marker.read_text()) if marker.is_file() else {}
    tracker = Tracker.from_config(cfg, run_name=f"train-{run_dir.name}", tags={"command": "at-train"})
    if state.get("mlflow_run_id"):
        tracker.attach(state["mlflow_run_id"])
    else:
        tracker.start()
        tracker.log_config(cfg)
        marker.write_text(json.dumps({"mlflow_run_id": tracker.run_id, "run_id": run_dir.name}))
    if previous is not None:
        print(f"at-train: resuming {run_dir}")
    trainer = None
    try:
        trainer = build_trainer(cfg, run_dir, tracker=tracker, resume=previous is not None)
        rows = trainer.fit()
        summary = trainer.finish(rows)
    except BaseException as e:
        tracker.end("KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
        raise
    finally:
        if trainer is not None:
            trainer.close()
    tracker.end()
    cli.print_kv(summary)
    return summary.get("reward_last3")


@hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> float | None:
    return cli.call(run, cfg, user_errors=user_errors)


def main() -> None:
    cli.main(_hydra_main, "train")


if __name__ == "__main__":
    main()
