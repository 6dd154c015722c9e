"""``at-train``: reinforcement learning of the agent that writes training jobs (the main job).

    at-train                                   # experiment=cpu_default: tiny agent, tiny models, CPU
    at-train experiment=smoke                  # a couple of minutes, for tests
    at-train experiment=seed_scale dry_run=true   # the published setting (GPU): resolved config only
    at-train resume=true                       # continue the newest run after its last complete step
    at-train -m experiment=smoke outer.lora_r=4,16    # a sweep: a table of its jobs at the end
    at-train -m seed=0,1,2 run_id=seeds            # three seeds; then at-compare runs=[runs/seeds] writes seeds.md
    at-train rerun=runs/<run_id>               # the same run again, from its saved overrides

Writes ``runs/<run_id>/``: checkpoints, episodes, metrics.jsonl, ledger.jsonl, plots/*.png; MLflow
holds one parent run with per-step metrics. Returns the mean reward of the last steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from agent_trainer import cli
from agent_trainer.config import CONFIG_DIR
from agent_trainer.paths import resolve_path
from agent_trainer.tracking import check_reachable
from agent_trainer.commands._errors import user_errors

RUN_MARKER = "outer_run.json"


# Settings a resumed run must share with its checkpoint: they fix the adapter's shape and scale.
SHAPE_KEYS = ("outer.lora_r", "outer.lora_alpha", "outer.lora_target_modules", "agent.model", "agent.model_path",
              "agent.backend")
# Settings that say nothing about the training itself.
RUN_KEYS = ("run_id", "resume", "dry_run", "runs_dir", "cache_dir")


def resume_folder(cfg: DictConfig, folder: Path) -> Path | None:
    """The run folder to continue (``resume=true``: the newest outer run in runs_dir, sweep jobs included), or None."""
    value = str(cfg.resume).strip()
    if value.lower() in ("false", "no", "0", ""):
        return None
    if value.lower() in ("true", "yes", "1"):
        runs = sorted((p.parent for p in Path(str(cfg.runs_dir)).glob(f"**/{RUN_MARKER}") if p.parent != folder),
                      key=lambda p: (p / RUN_MARKER).stat().st_mtime)
        if not runs:
            raise cli.UserError(f"resume=true: no earlier at-train run in {cfg.runs_dir}; start one without resume")
        return runs[-1]
    path = resolve_path(value)
    if not (path / RUN_MARKER).is_file():
        inside = sorted(p.parent for p in path.glob(f"*/{RUN_MARKER}")) if path.is_dir() else []
        hint = f"; it holds sweep runs: resume={inside[0]}" if inside else ""
        raise cli.UserError(f"resume={value}: not an at-train run folder (no {RUN_MARKER}){hint}")
    return path


def resume_changes(cfg: DictConfig, previous: Path) -> dict[str, tuple[str, str]]:
    """Settings that differ from the resumed run's: ``{key: (saved, now)}``; refuses the checkpoint-shaping ones."""
    from agent_trainer.tracking import flatten

    saved_file = previous / "config.resolved.yaml"
    if not saved_file.is_file():
        return {}
    saved = flatten(OmegaConf.load(saved_file))
    now = flatten(OmegaConf.to_container(cfg, resolve=True))
    changed = {k: (str(saved.get(k)), str(now.get(k))) for k in sorted(set(saved) | set(now))
               if k not in RUN_KEYS and str(saved.get(k)) != str(now.get(k))}
    shaped = [f"{k} {a} -> {b}" for k, (a, b) in changed.items() if k in SHAPE_KEYS]
    if shaped:
        raise cli.UserError(f"resume={previous}: the checkpoint was trained with other settings ({'; '.join(shaped)}); "
                            f"resume with the saved ones or start a new run")
    return changed


def run(cfg: DictConfig) -> float | None:
    """Train (or resume) on ``cfg``; returns the mean reward over the last 3 steps."""
    folder, conf = cli.open_run(cfg)
    if cfg.dry_run:
        from agent_trainer.outer_loop.rl.run_config import execution_plan

        # Builds every setting object and the executor: a dry run fails where a real run would.
        plan = execution_plan(conf)
        (folder / "plan.json").write_text(json.dumps(plan, indent=2, default=str) + "\n")
        cli.print_kv({k: v for k, v in plan.items() if k != "sbatch"})
        if plan.get("sbatch"):
            print("sbatch script of one outer step's batch:\n" + plan["sbatch"])
        return None
    check_reachable(cfg)  # a closed MLflow server fails here, in seconds
    previous = resume_folder(cfg, folder)  # before the heavy imports: a missing run is reported at once
    changes = resume_changes(cfg, previous) if previous is not None else {}
    from agent_trainer.outer_loop.rl.run_config import build_trainer, quiet_libraries

    quiet_libraries()  # one progress bar (outer steps), not one per model load and inner job
    run_dir = previous or folder
    marker = run_dir / RUN_MARKER
    state = json.loads(marker.read_text()) if marker.is_file() else {}
    tracker = cli.tracker(cfg, "at-train")
    if state.get("mlflow_run_id"):
        tracker.attach(state["mlflow_run_id"])
    else:
        tracker.start()
        tracker.log_config(cfg)
        marker.write_text(json.dumps({"mlflow_run_id": tracker.run_id, "run_id": str(cfg.run_id)}))
    if previous is not None:
        print(f"at-train: resuming {run_dir}")
        if changes:
            # MLflow params cannot change: the new values go to tags (resumed.<key>) and the console.
            tracker.set_tags({f"resumed.{k}": b for k, (_, b) in changes.items()})
            print("at-train: changed on resume: " + "; ".join(f"{k} {a} -> {b}" for k, (a, b) in changes.items()))
    trainer = None
    try:
        trainer = build_trainer(conf, run_dir, tracker=tracker, resume=previous is not None)
        rows = trainer.fit()
        summary = trainer.finish(rows)
    except BaseException as e:
        tracker.end("KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
        raise
    finally:
        if trainer is not None:
            trainer.close()
    tracker.end()
    cli.print_kv(readable_summary(summary))
    return summary.get("reward_last3")


def readable_summary(summary: dict) -> dict:
    """The summary for the console: numbers to 4 places, an interval as ``[lo, hi]`` (summary.json keeps full
    precision)."""
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4f}"
        if isinstance(v, list) and len(v) == 2 and all(isinstance(x, float) for x in v):
            return f"[{v[0]:.4f}, {v[1]:.4f}]"
        return v

    return {k: fmt(v) for k, v in summary.items()}


@hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> float | None:
    return cli.call(run, cfg, user_errors=user_errors)


def main() -> None:
    cli.main(_hydra_main, "train")


if __name__ == "__main__":
    main()
