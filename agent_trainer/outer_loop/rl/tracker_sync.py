"""MLflow mirror of a run folder: every complete step's metrics and one nested run per episode, logged exactly
once however often the run is killed and resumed (metrics.jsonl and the episodes' summary.json are the truth).

    sync_tracker(tracker, run_dir)     # after each checkpoint, and at the start of a resumed run
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent_trainer.outer_loop.episode.episode import reward_metrics
from agent_trainer.outer_loop.rl import heldout
from agent_trainer.outer_loop.rl.checkpoints import read_metrics_file


def sync_tracker(tracker, run_dir: Path) -> None:
    """Log to MLflow the metrics of complete steps that it does not hold yet (exactly once)."""
    if tracker is None or not getattr(tracker, "enabled", True):
        return
    from agent_trainer.tracking import metric_key, read_metrics

    run_dir = Path(run_dir)
    key = metric_key("reward_mean")  # metrics.jsonl keeps bare names; MLflow groups them (reward/, time/, ...)
    held_key = metric_key("heldout_reward_mean")
    history = read_metrics(tracker.tracking_uri, tracker.run_id, [key, held_key])
    logged = {s for s, _ in history[key]}
    held_logged = {s for s, _ in history[held_key]}
    rows = [row for row in read_metrics_file(run_dir) if row["step"] not in logged]
    children = tracker.child_names() if rows else set()
    for row in rows:
        # Nested episode runs first, then the step's metrics: a kill in between re-logs only the
        # children that are missing (by name), so each appears once.
        for summary in sorted((run_dir / "episodes").glob(f"s{row['step']:04d}-*/summary.json")):
            if summary.parent.name not in children:
                log_episode_run(tracker, json.loads(summary.read_text()), row["step"])
        # The row's end evaluation (at the next step) before the row itself, whose reward_mean marks
        # the row as logged: a kill in between re-logs the row only.
        (step, own), *end = heldout.points(row)
        for end_step, values in end:
            if end_step not in held_logged:
                tracker.log_metrics({metric_key(k): v for k, v in values.items()}, step=end_step)
        tracker.log_metrics({metric_key(k): v for k, v in own.items()}, step=step)


def split(episode_id: str) -> str:
    """``heldout``, ``train_eval`` (the training families on fixed seeds) or ``train``, from an episode's id."""
    tag = episode_id.split("-")[1] if episode_id.count("-") >= 1 else ""
    return {heldout.HELDOUT.tag: "heldout", heldout.TRAIN.tag: "train_eval"}.get(tag, "train")


def log_episode_run(tracker, summary: dict[str, Any], step: int) -> None:
    """One nested MLflow run per episode: its choices as params, its stages and cost as metrics."""
    reward = summary.get("reward") or {}
    with tracker.child(summary["episode_id"],
                       tags={"step": step, "task": summary.get("task"),
                             "split": split(summary["episode_id"])}) as ep:
        ep.log_params({f"choice.{k}": v for k, v in (summary.get("choices") or {}).items()})
        metrics = reward_metrics(reward)
        metrics.update({k: summary.get(k) for k in ("tokens_in", "tokens_out", "usd", "n_turns")
                        if isinstance(summary.get(k), (int, float))})
        ep.log_metrics(metrics, step=step)
