"""What a step and a run report: the step's metrics from its episodes, the training gain's interval, the run's
summary (first and last steps, held-out start and end, how the agent's choices moved). Pure functions of the
episodes' results and metrics.jsonl rows; docs/outer_loop.md lists the metrics.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from agent_trainer.outer_loop.episode.episode import EpisodeResult
from agent_trainer.outer_loop.rl import heldout

_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")


def choice_label(value: object) -> str:
    """A job's choice as part of a metric name: the value when it is a short name, else ``other`` (an agent may
    write anything in job.yaml; a metric name it shapes must stay one MLflow accepts)."""
    return value if isinstance(value, str) and _LABEL.fullmatch(value) else "other"


def step_metrics(results: list[EpisodeResult], update: dict, seconds: dict, ledger,
                 prefix: str = "") -> dict[str, float]:
    """Reward, stages, choices and cost of one step's episodes."""
    n = max(1, len(results))
    rewards = [r.reward["total"] for r in results]
    mean = sum(rewards) / n
    m: dict[str, float] = {
        "excluded": float(sum(bool(r.reward.get("excluded")) for r in results)),
        "reward_mean": mean,
        "reward_std": (sum((x - mean) ** 2 for x in rewards) / n) ** 0.5,
        "validation_mean": sum(r.reward["validation"] for r in results) / n,
        "valid_first_try": sum(r.reward["validation"] == 1.0 for r in results) / n,
        # a job submitted by the agent itself; by the harness at the turn limit (agent.submit_at_turn_limit)
        "submitted_rate": sum(bool(r.jobs) and not r.harness_submitted for r in results) / n,
        "harness_submitted_rate": sum(r.harness_submitted > 0 for r in results) / n,
        "valid_rate": sum(r.reward["validation"] > 0 for r in results) / n,   # a job called VALID at least once
        "refused_calls_mean": sum(r.refused_calls for r in results) / n,
        # episodes that submitted a job unchanged after validate_job called it INVALID (docs/results/)
        "submitted_unfixed_rate": sum(r.submitted_unfixed > 0 for r in results) / n,
        "job_success_rate": sum(r.reward["job_success"] for r in results) / n,
        "quality_mean": sum(r.reward["quality"] for r in results) / n,
        "speed_mean": sum(r.reward["speed"] for r in results) / n,
        "episodes": float(len(results)),
        "tokens": float(sum(r.tokens_in + r.tokens_out for r in results)),
        "usd": usd(sum(r.usd for r in results)),
    }
    ups = [r.reward["uplift"] for r in results if r.reward.get("uplift") is not None]
    m["uplift_mean"] = sum(ups) / len(ups) if ups else 0.0
    for key in ("base_model", "algorithm", "peft"):
        values = [choice_label(r.choices.get(key)) for r in results if r.choices]
        for v in sorted(set(values)):
            m[f"share_{key}_{v}"] = values.count(v) / n
    m = {prefix + k: v for k, v in m.items()}
    if not prefix:
        m.update({f"update_{k}": float(v) for k, v in update.items()})
        m.update({f"seconds_{k}": float(v) for k, v in seconds.items()})
        if ledger is not None:
            tot = ledger.run_totals()
            m["usd_cumulative"] = usd(tot.usd)
            m["usd_measured_cumulative"] = usd(tot.usd_measured)   # jobs priced on their measured seconds
            m["tokens_cumulative"] = float(tot.tokens)
    return m


def usd(total: float) -> float:
    """A sum of dollars to 1e-10 (a nano-cent): the same sums in another order (jobs that finished in another
    order) differ in the last bits of a float, not here."""
    return round(float(total), 10)


def training_gain(run_dir: Path, steps: int, k: int = 3) -> dict[str, float]:
    """``reward_gain_lo`` / ``_hi``: the bootstrap 95% interval of the last ``k`` steps' training episodes' mean
    reward minus the first ``k`` steps' (each side resampled on its own; excluded episodes left out), read from
    the episodes' ``summary.json``; {} under ``2 k`` steps."""
    from agent_trainer.outer_loop.report.bootstrap import diff_ci

    def rewards(step_range) -> list[float]:
        out = []
        for s in step_range:
            for f in sorted((Path(run_dir) / "episodes").glob(f"s{s:04d}-train-*/summary.json")):
                r = json.loads(f.read_text()).get("reward") or {}
                if not r.get("excluded") and isinstance(r.get("total"), (int, float)):
                    out.append(float(r["total"]))
        return out

    if steps < 2 * k:
        return {}
    first, last = rewards(range(k)), rewards(range(steps - k, steps))
    if not first or not last:
        return {}
    _, lo, hi = diff_ci(first, last)
    return {"reward_gain_lo": lo, "reward_gain_hi": hi}


def summarize(rows: list[dict], k: int = 3) -> dict[str, Any]:
    """First-k and last-k mean reward, their gap, the held-out start, end and paired gain (each with its
    95% interval, ``agent_trainer.outer_loop.rl.heldout.summary``), the training families' paired gain
    (``heldout.train_summary``), and how the choices moved."""
    if not rows:
        return {"steps": 0}
    first, last = rows[:k], rows[-k:]

    def mean(xs, key):
        vals = [x.get(key, 0.0) for x in xs]
        return sum(vals) / len(vals)

    out = {"steps": len(rows), f"reward_first{k}": mean(first, "reward_mean"),
           f"reward_last{k}": mean(last, "reward_mean")}
    out["reward_gain"] = out[f"reward_last{k}"] - out[f"reward_first{k}"]
    if "reward_gain_lo" in rows[-1]:
        out["reward_gain_ci"] = [rows[-1]["reward_gain_lo"], rows[-1]["reward_gain_hi"]]
    out.update(heldout.summary(rows))
    out.update(heldout.train_summary(rows))
    for key in sorted({k2 for r in rows for k2 in r
                       if k2.startswith("share_") or k2 in ("valid_first_try", "submitted_unfixed_rate")}):
        out[f"{key}_first{k}"] = mean(first, key)
        out[f"{key}_last{k}"] = mean(last, key)
    out["usd_total"] = rows[-1].get("usd_cumulative", 0.0)
    return out
