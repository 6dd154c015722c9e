"""Fixed-seed evaluations: a family set played with no update from it, on the same episode seeds at every
evaluation, so two evaluations differ only by the policy that played them.

- ``HELDOUT``: the held-out families, at the start, every ``outer.heldout_every`` steps and at the end
  (``heldout_*``, ``heldout_end_*``, the paired ``heldout_gain``);
- ``TRAIN``: the training families, at the start and the end when ``outer.train_eval_episodes`` > 0
  (``train_eval_*``, ``train_eval_end_*``, the paired ``paired_train_*``, as ``scripts/policy_eval.py`` writes).

When they run, their seeds, their metrics and the paired gains: docs/evaluation.md, "Held-out evaluation".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from agent_trainer.outer_loop.report.bootstrap import mean_ci, paired_diff_ci

SEED_BASE = (-1,)        # a held-out episode's seed is hash((-1, task index, g)): fixed, and no training step is < 0
PREFIX, END_PREFIX = "heldout_", "heldout_end_"
REWARDS = "rewards"      # heldout_rewards / heldout_end_rewards: per-episode rewards, in episode order


@dataclass(frozen=True)
class Evaluation:
    """A fixed-seed evaluation's names: metric prefixes of the evaluations before an update (``prefix``) and after
    the last one (``end_prefix``), the episode folders' tag (``s0000-<tag>-<task>-<g>``, ``<tag>-end`` at the
    end) and the key of its seconds."""

    prefix: str
    end_prefix: str
    tag: str
    seconds: str

    def tag_of(self, prefix: str) -> str:
        return self.tag if prefix == self.prefix else f"{self.tag}-end"


HELDOUT = Evaluation(PREFIX, END_PREFIX, "heldout", "seconds_heldout")
TRAIN = Evaluation("train_eval_", "train_eval_end_", "traineval", "seconds_train_eval")
EVALUATIONS = (HELDOUT, TRAIN)
PAIRED_TRAIN = "paired_train_"   # the training families' start, end and paired gain (``paired_names``)


def evaluation_of(prefix: str) -> Evaluation:
    """The evaluation whose metrics carry ``prefix`` (either of its two)."""
    return next(e for e in EVALUATIONS if prefix in (e.prefix, e.end_prefix))


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


def start_row(rows: Sequence[dict], prefix: str = PREFIX) -> dict | None:
    """The step-0 row when it holds the start evaluation under ``prefix`` (before step 0's update)."""
    return rows[0] if rows and rows[0].get("step") == 0 and f"{prefix}reward_mean" in rows[0] else None


def paired_names(label: str, start: float, end: float, gain: float, lo: float, hi: float,
                 episodes: int) -> dict[str, float]:
    """A family set's paired evaluation as run metrics: ``paired_<label>_start``, ``_end``, ``_gain``, ``_gain_lo``,
    ``_gain_hi``, ``_episodes`` (per task); in the run (``paired_train``) and after it (scripts/policy_eval.py)."""
    p = f"paired_{label}_"
    return {p + "start": start, p + "end": end, p + "gain": gain, p + "gain_lo": lo, p + "gain_hi": hi,
            p + "episodes": float(episodes)}


def paired_train(start: dict, end: dict, episodes: int) -> dict[str, float]:
    """The training families' start (``start``: a row with ``train_eval_*``) and end (``end``: with
    ``train_eval_end_*``) evaluations paired, as ``paired_train_start``, ``_end``, ``_gain``, ``_gain_lo``,
    ``_gain_hi`` and ``_episodes`` (per task); {} unless both played the same episodes."""
    s, e = start.get(TRAIN.prefix + REWARDS), end.get(TRAIN.end_prefix + REWARDS)
    if not s or not e or len(s) != len(e):
        return {}
    gain, lo, hi = paired_diff_ci(s, e)
    return paired_names("train", start[f"{TRAIN.prefix}reward_mean"], end[f"{TRAIN.end_prefix}reward_mean"],
                        gain, lo, hi, episodes)


def paired(evaluation: Evaluation, start: dict, end: dict, episodes: int) -> dict[str, float]:
    """An evaluation's end (``end``: its ``end_prefix`` metrics) paired with its start (``start``: the step-0 row):
    ``heldout_gain*`` for the held-out families, ``paired_train_*`` for the training ones."""
    if evaluation is TRAIN:
        return paired_train(start, end, episodes)
    return gain_metrics(start.get(PREFIX + REWARDS), end.get(END_PREFIX + REWARDS))


def train_summary(rows: Sequence[dict]) -> dict[str, Any]:
    """The training families' start, end and paired gain with its interval (``outer.train_eval_episodes``); the
    start alone while the run has no end evaluation; {} without either."""
    p, last = PAIRED_TRAIN, rows[-1] if rows else {}
    if p + "gain" in last:
        return {p + "start": last[p + "start"], p + "end": last[p + "end"], p + "gain": last[p + "gain"],
                p + "gain_ci": [last[p + "gain_lo"], last[p + "gain_hi"]], p + "episodes": last[p + "episodes"]}
    start = start_row(rows, TRAIN.prefix)
    return {p + "start": start[f"{TRAIN.prefix}reward_mean"]} if start else {}


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
    end evaluations, if any, at the next step (``heldout_end_*`` as ``heldout_*``, ``train_eval_end_*`` as
    ``train_eval_*``: the policy after that many updates); lists (per-episode rewards) are left out."""
    step = int(row["step"])
    numbers = {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
    ends = tuple(e.end_prefix for e in EVALUATIONS)
    end = {e.prefix + k[len(e.end_prefix):]: v for e in EVALUATIONS for k, v in numbers.items()
           if k.startswith(e.end_prefix)}
    own = {k: v for k, v in numbers.items() if not k.startswith(ends)}
    return [(step, own)] + ([(step + 1, end)] if end else [])
