"""Held-out evaluation: the held-out families played with no update from them, on the same episode
seeds at every evaluation, so two evaluations differ only by the policy that played them.

When it runs (start, every ``outer.heldout_every`` steps, end), its seeds, its metrics and the paired
gain: docs/outer_loop.md, "Held-out evaluation".
"""

from __future__ import annotations

from typing import Any, Sequence

from agent_trainer.outer_loop.report.bootstrap import mean_ci, paired_diff_ci

SEED_BASE = (-1,)        # a held-out episode's seed is hash((-1, task index, g)): fixed, and no training step is < 0
PREFIX, END_PREFIX = "heldout_", "heldout_end_"
REWARDS = "rewards"      # heldout_rewards / heldout_end_rewards: per-episode rewards, in episode order


def schedule(step: int, steps: int, every: int, at_start: bool, enabled: bool = True) -> tuple[bool, bool]:
    """``(before_update, after_update)``: whether step ``step`` of ``steps`` evaluates the held-out families."""
    if not enabled or every <= 0:
        return False, False
    end = step == steps - 1
    before = at_start if step == 0 else (step % every == 0 and not end)
    return before, end


def interval_metrics(rewards: Sequence[float], prefix: str = PREFIX) -> dict[str, Any]:
    """``<prefix>reward_lo`` / ``_hi`` (bootstrap 95%) and ``<prefix>rewards`` (the list) of one evaluation."""
    _, lo, hi = mean_ci(rewards)
    return {f"{prefix}reward_lo": lo, f"{prefix}reward_hi": hi, f"{prefix}{REWARDS}": [float(r) for r in rewards]}


def gain_metrics(start: Sequence[float] | None, end: Sequence[float] | None) -> dict[str, float]:
    """``heldout_gain`` (end - start) and its paired 95% interval; {} without both, or with other episodes."""
    if not start or not end or len(start) != len(end):
        return {}
    gain, lo, hi = paired_diff_ci(start, end)
    return {"heldout_gain": gain, "heldout_gain_lo": lo, "heldout_gain_hi": hi}


def start_row(rows: Sequence[dict]) -> dict | None:
    """The step-0 row when it holds the start evaluation (before step 0's update)."""
    return rows[0] if rows and rows[0].get("step") == 0 and f"{PREFIX}reward_mean" in rows[0] else None


def summary(rows: Sequence[dict]) -> dict[str, Any]:
    """Start, end and the paired gain (each with its interval) of a run's held-out evaluations; {} without any.

    The end is the last row's end evaluation; a run stopped early has none (its last periodic one is
    ``heldout_last``)."""
    out: dict[str, Any] = {}
    start = start_row(rows)
    end = rows[-1] if rows and f"{END_PREFIX}reward_mean" in rows[-1] else None
    for name, row, prefix in (("start", start, PREFIX), ("end", end, END_PREFIX)):
        if row is not None:
            out[f"heldout_{name}"] = row[f"{prefix}reward_mean"]
            out[f"heldout_{name}_ci"] = [row.get(f"{prefix}reward_lo"), row.get(f"{prefix}reward_hi")]
    if start is not None and end is not None:
        g = gain_metrics(start.get(PREFIX + REWARDS), end.get(END_PREFIX + REWARDS))
        if g:
            out["heldout_gain"] = g["heldout_gain"]
            out["heldout_gain_ci"] = [g["heldout_gain_lo"], g["heldout_gain_hi"]]
    if end is None:
        periodic = [r for r in rows if f"{PREFIX}reward_mean" in r and r is not start]
        if periodic:
            out["heldout_last"] = periodic[-1][f"{PREFIX}reward_mean"]
            out["heldout_last_step"] = periodic[-1]["step"]
    if out:
        n = next((len(r.get(p + REWARDS) or []) for r, p in ((start, PREFIX), (end, END_PREFIX)) if r), None)
        if n:
            out["heldout_episodes"] = n
    return out


def points(row: dict) -> list[tuple[int, dict[str, float]]]:
    """A metrics.jsonl row as MLflow points ``[(step, {bare name: number})]``: the row at its step and its
    end evaluation, if any, as ``heldout_*`` at the next step; lists (per-episode rewards) are left out."""
    step = int(row["step"])
    numbers = {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
    end = {PREFIX + k[len(END_PREFIX):]: v for k, v in numbers.items() if k.startswith(END_PREFIX)}
    own = {k: v for k, v in numbers.items() if not k.startswith(END_PREFIX)}
    return [(step, own)] + ([(step + 1, end)] if end else [])
