"""``at-train``: reinforcement learning of the agent that writes training jobs (the main job).

    at-train                                   # experiment=cpu_default: tiny agent, tiny models, CPU
    at-train experiment=smoke                  # a couple of minutes, for tests
    at-train experiment=seed_scale dry_run=true   # the published setting (GPU): resolved config only
    at-train resume=true                       # continue the newest run after its last complete step
    at-train -m seed=0,1,2 resume=true         # ... each seed its own (the newest run with its settings)
    at-train resume=true 'resume_allow_changes=[hardware]'   # ... on other hardware settings (others are refused)
    at-train resume=runs/<run_id> outer.steps=20   # that run, with the overrides it was made with, made longer
    at-train -m experiment=smoke outer.lora_r=4,16    # a sweep: a table of its jobs at the end
    at-train -m seed=0,1,2 run_id=seeds            # three seeds; then at-compare runs=[runs/seeds] writes seeds.md
    at-train rerun=runs/<run_id>               # the same run again, from its saved overrides

Writes ``runs/<run_id>/``: checkpoints, episodes, metrics.jsonl, ledger.jsonl, plots/*.png; MLflow
holds one parent run with per-step metrics. Returns the mean reward of the last steps.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from agent_trainer import cli
from agent_trainer.config import CONFIG_DIR, TrainCommand
from agent_trainer.paths import resolve_path
from agent_trainer.tracking import check_reachable
from agent_trainer.commands._errors import user_errors
from agent_trainer.commands._task_specs import check_answer_room, heldout_warning, resolve_specs

RUN_MARKER = "outer_run.json"


# Settings a resumed run must share with its checkpoint: they fix the adapter's shape and scale.
SHAPE_KEYS = ("outer.lora_r", "outer.lora_alpha", "outer.lora_target_modules", "agent.model", "agent.model_path",
              "agent.backend")
# Settings that say nothing about the training itself.
RUN_KEYS = ("run_id", "resume", "resume_allow_changes", "dry_run", "runs_dir", "cache_dir")
# Changes a resume may make without resume_allow_changes: more steps continue the same run (the steps done
# are unchanged; a held-out end evaluation runs at the new last step).
SAFE_CHANGES = ("outer.steps",)


def steps_completed(folder: Path) -> int:
    """How many outer steps a run folder completed (its newest checkpoint's state; 0 when none)."""
    from agent_trainer.outer_loop.rl.checkpoints import last_complete_step

    ckpt = last_complete_step(Path(folder))
    if ckpt is None:
        return 0
    try:
        return int(json.loads((ckpt / "state.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


LOCK_FILE = ".train.lock"   # held (flock) by the at-train process training in the folder, while it trains


def hold_run(folder: Path):
    """Take ``folder``'s run lock, or refuse: one at-train process trains a run at a time (two resuming the same
    run would write the same steps' checkpoints, ledger and MLflow metrics). Returns the open lock file; the lock
    lasts until it is closed or the process ends, however it ends."""
    fh = open(Path(folder) / LOCK_FILE, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        pid = fh.read().strip() or "?"
        fh.close()
        raise cli.UserError(f"{folder} is being trained by another at-train process (pid {pid}); wait for it to end, "
                            f"or stop it (its complete steps are kept) and resume then") from None
    fh.truncate(0)
    fh.write(str(os.getpid()))
    fh.flush()
    return fh


def in_training(folder: Path) -> bool:
    """Whether another process holds ``folder``'s run lock (trains it now)."""
    path = Path(folder) / LOCK_FILE
    if not path.is_file():
        return False
    with open(path) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
    return False


def resume_folder(conf: TrainCommand, folder: Path, cfg: DictConfig | None = None) -> Path | None:
    """The run folder to continue, or None: ``resume=true`` takes the newest at-train run in runs_dir (sweep jobs
    included) that completed a step, that no other process trains now and, given ``cfg``, that this command may
    continue (its settings, as ``resume_changes`` allows): ``at-train -m seed=0,1,2 resume=true`` continues each
    seed's own run. Folders of runs that failed before their first step are never taken."""
    value = conf.resume
    if value == "false":
        return None
    if value == "true":
        runs = [p.parent for p in Path(conf.runs_dir).glob(f"**/{RUN_MARKER}") if p.parent != folder]
        busy = [p for p in runs if in_training(p)]
        done = sorted((p for p in runs if steps_completed(p) > 0 and p not in busy),
                      key=lambda p: (p / RUN_MARKER).stat().st_mtime, reverse=True)
        if not done:
            more = ", ".join(filter(None, [
                f"{len(busy)} being trained by another process" if busy else "",
                f"{len(runs) - len(busy)} ended before their first step" if len(runs) > len(busy) else ""]))
            more = f" ({more})" if more else ""
            raise cli.UserError(f"resume=true: no at-train run in {conf.runs_dir} completed a step{more}; "
                                f"start one without resume")
        if cfg is None:
            return done[0]
        newest = None   # why the newest run cannot be continued, if none can
        for run in done:
            try:
                resume_changes(cfg, run)
                return run
            except cli.UserError as e:
                newest = newest or e
        raise cli.UserError(f"resume=true: none of the {len(done)} runs in {conf.runs_dir} that completed a step "
                            f"has this command's settings; the newest: {newest}") from None
    path = resolve_path(value)
    if not (path / RUN_MARKER).is_file():
        inside = sorted(p.parent for p in path.glob(f"*/{RUN_MARKER}")) if path.is_dir() else []
        hint = f"; it holds sweep runs: resume={inside[0]}" if inside else ""
        raise cli.UserError(f"resume={value}: not an at-train run folder (no {RUN_MARKER}){hint}")
    if steps_completed(path) == 0:
        raise cli.UserError(f"resume={value}: that run never completed a step (nothing to continue); "
                            f"start a new run without resume")
    return path


def resume_changes(cfg: DictConfig, previous: Path) -> dict[str, tuple[str, str]]:
    """Settings that differ from the resumed run's: ``{key: (saved, now)}``. Refuses the checkpoint-shaping ones
    always, and any other change that is neither safe (``SAFE_CHANGES``) nor named in ``resume_allow_changes``."""
    from agent_trainer.tracking import flatten

    saved_file = previous / "config.resolved.yaml"
    if not saved_file.is_file():
        return {}
    saved = flatten(OmegaConf.load(saved_file))
    now = flatten(OmegaConf.to_container(cfg, resolve=True))
    # A key the saved run lacks is a setting newer than the run (or one this version dropped): it is reported,
    # not refused, or no run could be resumed after an upgrade.
    changed = {k: (str(saved[k]) if k in saved else "(not saved)", str(now[k]) if k in now else "(no such setting)")
               for k in sorted(set(saved) | set(now))
               if k not in RUN_KEYS and str(saved.get(k)) != str(now.get(k))}
    newer = {k for k in changed if k not in saved or k not in now}
    shaped = [f"{k} {a} -> {b}" for k, (a, b) in changed.items() if k in SHAPE_KEYS]
    if shaped:
        raise cli.UserError(f"resume={previous}: the checkpoint was trained with other settings ({'; '.join(shaped)}); "
                            f"resume with the saved ones or start a new run")
    allowed = [str(a) for a in (cfg.get("resume_allow_changes") or [])] + list(SAFE_CHANGES)
    refused = [f"{k} {a} -> {b}" for k, (a, b) in changed.items()
               if k not in newer and not any(k == x or k.startswith(x + ".") for x in allowed)]
    if refused:
        keys = ",".join(k.split(" ", 1)[0] for k in refused)
        raise cli.UserError(f"resume={previous}: settings differ from the saved run ({'; '.join(refused)}); "
                            f"resume with the saved ones, or allow them: 'resume_allow_changes=[{keys}]'")
    return changed


RESUMES_FILE = "resumes.jsonl"


def record_resume(run_dir: Path, steps_done: int, changes: dict[str, tuple[str, str]]) -> dict:
    """One line per resume in ``<run>/resumes.jsonl``: when, after how many complete steps, the resuming command's
    overrides, the settings it changed, and what differs in the machine and packages it runs on
    (``machine_changes``, returned). ``config.resolved.yaml``, ``versions.json`` and ``run.json`` keep the run's
    first settings, so a run resumed with other ones (``outer.steps``, ``resume_allow_changes``) or elsewhere is
    read back from them and this file."""
    from datetime import datetime, timezone

    from agent_trainer import sweeps

    info = sweeps.job_info("at-train")
    moved = machine_changes(run_dir)
    line = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"), "steps_done": steps_done,
            "overrides": info.overrides, "changes": {k: {"saved": a, "now": b} for k, (a, b) in changes.items()},
            "machine": {k: {"saved": a, "now": b} for k, (a, b) in moved.items()}}
    with open(Path(run_dir) / RESUMES_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    return moved


def machine_changes(run_dir: Path) -> dict[str, tuple[Any, Any]]:
    """What this process runs on that differs from the run's ``versions.json`` (the first process's): package
    versions, python, and each field of the kind of CPU (``agent_trainer.kernels.cpu_kind``: vendor, torch's
    kernel level, the kernel settings), as ``{key: (saved, now)}`` (``cpu.vendor``). Either changes the last digits
    of what the resumed steps compute, so the run no longer equals one made in one go. Keys the saved file lacks
    (a run saved before they were recorded) are not compared."""
    from agent_trainer.kernels import cpu_kind

    try:
        saved = json.loads((Path(run_dir) / "versions.json").read_text())
    except (OSError, ValueError):
        return {}
    now, saved = cli.flat_versions({**cli.package_versions(), "cpu": cpu_kind()}), cli.flat_versions(saved)
    has_cpu = any(k.startswith("cpu.") for k in saved)
    keys = [k for k in {**saved, **now} if k in saved or (has_cpu and k.startswith("cpu."))]
    return {k: (saved.get(k), now.get(k)) for k in keys if saved.get(k) != now.get(k)}


def run(cfg: DictConfig) -> float | None:
    """Train (or resume) on ``cfg``; returns the mean reward over the last 3 steps."""
    folder, conf = cli.open_run(cfg)
    warning = heldout_warning(conf)
    if warning:
        print(warning, file=sys.stderr)
    previous = resume_folder(conf, folder, cfg) if not conf.dry_run else None  # a missing run is reported at once
    changes = resume_changes(cfg, previous) if previous is not None else {}
    resolve_specs(conf, previous or folder)   # every family's spec (or card), dry run included
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
    check_answer_room(conf)
    from agent_trainer.outer_loop.rl.run_config import check_executor, quiet_libraries

    check_executor(conf)   # a SLURM controller or Ray head that does not answer fails here, before any work

    quiet_libraries()  # one progress bar (outer steps), not one per model load and inner job
    run_dir = previous or folder
    lock = hold_run(run_dir)   # before anything is written there: a second process on the same run is refused
    try:
        return _train(cfg, conf, run_dir, previous, changes)
    finally:
        lock.close()


def _train(cfg: DictConfig, conf: TrainCommand, run_dir: Path, previous: Path | None, changes: dict) -> float | None:
    """``run`` in the run folder it holds: resume bookkeeping, the MLflow run, the outer loop, the summary."""
    from agent_trainer.outer_loop.rl.run_config import build_trainer

    moved: dict[str, tuple[Any, Any]] = {}
    if previous is not None:
        done = steps_completed(run_dir)
        if conf.outer.steps < done:   # refused before the resumed folder is touched
            raise cli.UserError(f"resume={run_dir}: outer.steps={conf.outer.steps} is below the {done} steps the run "
                                f"completed; a resume cannot undo steps (resume with outer.steps>={done})")
        cli.continue_in(previous)  # run.json, train.log and the outcome go to the resumed folder
        moved = record_resume(run_dir, done, changes)
        how = "the newest run with these settings" if conf.resume == "true" else "given"
        print(f"at-train: resuming {run_dir} ({how}) after its step {done - 1}")
        if moved:
            print(f"at-train: resumed on another machine or software than the run began on "
                  f"({'; '.join(f'{k} {a} -> {b}' for k, (a, b) in moved.items())}): steps {done} on will not "
                  f"match the same run made in one go to the last digit (docs/inner_loop.md, \"The same numbers "
                  f"on another CPU\")", file=sys.stderr)
        if done >= conf.outer.steps:
            print(f"at-train: {run_dir} has all its {conf.outer.steps} steps: nothing to train (raise outer.steps to "
                  f"continue it)")
    tracker = cli.tracker(cfg, "at-train")
    trainer = None
    try:
        # Every start-up error (a missing spec or model, a bad setting) comes before the MLflow run exists.
        trainer = build_trainer(conf, run_dir, tracker=tracker, resume=previous is not None)
        cli.record_cpu(run_dir)   # now, not at the end: a run killed midway is the one resumed elsewhere
        marker = run_dir / RUN_MARKER
        state = json.loads(marker.read_text()) if marker.is_file() else {}
        if state.get("mlflow_run_id"):
            tracker.attach(state["mlflow_run_id"])
        else:
            tracker.start()
            tracker.log_config(cfg)
            marker.write_text(json.dumps({"mlflow_run_id": tracker.run_id, "run_id": conf.run_id}))
        if moved:
            tracker.set_tags({f"resumed.{k}": str(b) for k, (_, b) in moved.items()})
        if changes:
            # MLflow params cannot change: the new values go to tags (resumed.<key>) and the console.
            tracker.set_tags({f"resumed.{k}": b for k, (_, b) in changes.items()})
            print("at-train: changed on resume: " + "; ".join(f"{k} {a} -> {b}" for k, (a, b) in changes.items()))
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
    jobs, crashed = inner_jobs(run_dir)
    from agent_trainer import sweeps

    sweeps.write_run_file(run_dir, jobs=len(jobs), jobs_crashed=len(crashed))
    if crashed:
        print(f"at-train: {len(crashed)} of {len(jobs)} inner jobs crashed (their worker.log: "
              f"{crashed[0].parent / 'worker.log'}{', ...' if len(crashed) > 1 else ''})", file=sys.stderr)
    return summary.get("reward_last3")


def inner_jobs(run_dir: Path) -> tuple[list[Path], list[Path]]:
    """The ``result.json`` of every inner job of the run's kept episodes, and those of the crashed ones."""
    results = sorted(Path(run_dir).glob("episodes/*/jobs/*/output/result.json"))
    crashed = []
    for path in results:
        try:
            if json.loads(path.read_text()).get("status") == "crashed":
                crashed.append(path)
        except (OSError, ValueError):
            crashed.append(path)   # a result that cannot be read is a job that did not end properly
    return results, crashed


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
    return cli.call(run, cfg, user_errors=user_errors, value_name="reward/reward_last3")


def main() -> None:
    cli.main(_hydra_main, "train")


if __name__ == "__main__":
    main()
