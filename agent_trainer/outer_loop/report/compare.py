"""Compare runs: tables (per run, per setting) and PNG plots of runs read from MLflow.

    >>> runs = collect("sqlite:///runs/mlflow.db", ["<mlflow run id>", "runs/<sweep>", "runs/<sweep>/3"])
    >>> rows = run_rows(runs)            # grouped by the params that differ between the runs
    >>> write_report(runs, rows, "runs/<compare run>")   # compare.md/.csv, configs.md/.csv, *.png, plot_data.json

Reading the runs (``collect``, ``RunData``, ``CompareError``) lives in ``agent_trainer.outer_loop.report.compare_runs``
and is importable from here. Which metric names are read and how runs are grouped: docs/sweeps.md, "Compare".
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Sequence

from agent_trainer.outer_loop.report.compare_runs import (HISTORY_KEYS, REWARD_KEYS, RUN_FILES, CompareError, Note,
                                                          RunData, RunRef, collect, resolve)

__all__ = ["HISTORY_KEYS", "REWARD_KEYS", "RUN_FILES", "CompareError", "Note", "RunData", "RunRef", "collect",
           "resolve", "differing_keys", "group_keys", "short_names", "legend_labels", "run_rows", "config_rows",
           "write_table", "plot_data", "write_plots", "write_report"]

STAGE_KEYS = {"validation": ("validation_mean", "reward_validation"),
              "job_success": ("job_success_rate", "reward_job_success"),
              "quality": ("quality_mean", "reward_quality"), "speed": ("speed_mean", "reward_speed")}
COST_KEYS = ("usd_cumulative", "usd")
SWITCH_KEYS = ("switch_rate", "switches", "pairs", "first_switch")
ADOPTION_TYPES = ("execution", "strategy")
# The settings columns (one per grouping param) go between "status" and "config".
COLUMNS = ("run", "run_id", "command", "status", "config", "value", "reward", "validation", "job_success", "quality",
           "speed", "switch_rate", "switches", "pairs", "first_switch", "adoption_execution", "adoption_strategy",
           "usd", "usd_per_reward")
CONFIG_COLUMNS = ("config", "runs", "value_mean", "reward_mean", "switch_rate", "pairs", "adoption_execution",
                  "adoption_strategy", "usd", "usd_per_reward")
DEFAULT_GROUP_BY = ("agent.model", "strategy.mode")
# Params that differ from run to run without saying anything about the setting (branch.message follows branch,
# hardware.launcher_dir runs_dir).
IGNORED_KEYS = frozenset({"run_id", "resume", "rerun", "dry_run", "out", "runs", "experiments", "runs_dir",
                          "cache_dir", "branch.message", "hardware.launcher_dir"})
IGNORED_PREFIXES = ("hydra.", "tracking.")
# Why a panel is missing (plot_data.json "skipped", the printed notes).
NO_DATA = {"reward_curves": "no run logged a reward per step (reward_mean or reward_total)",
           "job_scores": "no run logged a hidden score per job (job_hidden_score)",
           "stages": "no run logged a reward stage (validation, job success, quality, speed)",
           "switch_rates": "no run logged a strategy switch rate (switch_rate: episodes of several jobs)",
           "adoption": "no run logged suggestion adoption (adoption_*: an evaluator's suggestions)",
           "cost": "no run logged USD with a positive reward (usd_cumulative or usd)"}


# --- settings and tables ------------------------------------------------------------------------


def differing_keys(runs: Sequence[RunData]) -> list[str]:
    """Params whose values differ between the runs that log them, less ``IGNORED_KEYS`` / prefixes; sorted."""
    values: dict[str, list[str]] = {}
    for r in runs:
        for k, v in r.params.items():
            values.setdefault(k, []).append(v)
    return sorted(k for k, vs in values.items()
                  if len(set(vs)) > 1 and k not in IGNORED_KEYS and not k.startswith(IGNORED_PREFIXES))


def group_keys(runs: Sequence[RunData], group_by: Sequence[str] | None = None) -> list[str]:
    """``group_by`` when given, else the differing params, else ``DEFAULT_GROUP_BY``."""
    return list(group_by or differing_keys(runs) or DEFAULT_GROUP_BY)


def short_names(keys: Sequence[str]) -> dict[str, str]:
    """``outer.lora_r`` -> ``lora_r`` where no other key ends the same, else the full key."""
    lasts = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: last if lasts.count(last) == 1 else k for k, last in zip(keys, lasts)}


def legend_labels(runs: Sequence[RunData], keys: Sequence[str] | None = None) -> list[str]:
    """Per run, its differing settings (``lora_r=4 seed=1``), else its name; unique (``#<id>`` added)."""
    keys = differing_keys(runs) if keys is None else list(keys)
    short = short_names(keys)
    labels = [" ".join(f"{short[k]}={r.params[k]}" for k in keys if k in r.params) or r.name for r in runs]
    return [f"{lab} #{r.run_id[:6]}" if labels.count(lab) > 1 else lab for lab, r in zip(labels, runs)]


def run_rows(runs: Sequence[RunData], group_by: Sequence[str] | None = None) -> list[dict]:
    """One row per run (``COLUMNS``, ``settings``: ``{group key: value}``, ``label``: its legend)."""
    keys = group_keys(runs, group_by)
    rows = []
    for r, label in zip(runs, legend_labels(runs)):
        reward_key, reward = r.first(REWARD_KEYS)
        _, usd = r.first(COST_KEYS)
        settings = {k: r.params.get(k) for k in keys}
        row: dict[str, Any] = {"run": r.name, "run_id": r.run_id, "command": r.command, "status": r.status,
                               "value": r.value, "value_name": r.value_name, "reward": reward,
                               "reward_key": reward_key, "usd": usd, "label": label, "settings": settings,
                               "config": " ".join(f"{k}={'-' if v is None else v}" for k, v in settings.items())}
        if r.params.get("branch") and "branch" not in keys:
            row["config"] += f" branch={r.params['branch']}"
        for stage, stage_keys in STAGE_KEYS.items():
            row[stage] = r.first(stage_keys)[1]
        for k in SWITCH_KEYS:
            row[k] = r.metrics.get(k)
        for t in ADOPTION_TYPES:
            row[f"adoption_{t}"] = r.metrics.get(f"adoption_{t}")
            row[f"suggestions_{t}"] = r.metrics.get(f"suggestions_{t}")
            row[f"adopted_{t}"] = r.metrics.get(f"adopted_{t}")
        row["usd_per_reward"] = usd / reward if usd is not None and reward and reward > 0 else None
        rows.append(row)
    return rows


def config_rows(rows: Sequence[dict]) -> list[dict]:
    """Per setting: runs, mean reward, pooled switch rate and adoption, cost per unit of reward."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["config"], []).append(r)
    out = []
    for cfg, rs in groups.items():
        rewards = [r["reward"] for r in rs if r["reward"] is not None]
        values = [r["value"] for r in rs if r.get("value") is not None]
        pairs = sum(r["pairs"] or 0 for r in rs)
        usd = sum(r["usd"] or 0.0 for r in rs)
        row = {"config": cfg, "settings": rs[0].get("settings", {}), "runs": len(rs),
               "reward_mean": sum(rewards) / len(rewards) if rewards else None,
               "value_mean": sum(values) / len(values) if values else None,
               "switch_rate": sum(r["switches"] or 0 for r in rs) / pairs if pairs else None, "pairs": pairs,
               "usd": usd, "usd_per_reward": usd / sum(rewards) if rewards and sum(rewards) > 0 else None}
        for t in ADOPTION_TYPES:
            n = sum(r[f"suggestions_{t}"] or 0 for r in rs)
            row[f"adoption_{t}"] = sum(r[f"adopted_{t}"] or 0 for r in rs) / n if n else None
        out.append(row)
    return out


# --- output -----------------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v).replace("|", "/")


def write_table(rows: Sequence[dict], columns: Sequence[str], stem: Path) -> tuple[Path, Path]:
    """``<stem>.md`` (rounded for reading) and ``<stem>.csv`` (full precision); a row's ``settings`` are columns."""
    rows = [{**r.get("settings", {}), **r} for r in rows]   # a metric column wins a name clash
    md = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    md += ["| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |" for r in rows]
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    with open(stem.with_suffix(".csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        w.writerows([{c: ("" if r.get(c) is None else r.get(c)) for c in columns} for r in rows])
    return stem.with_suffix(".md"), stem.with_suffix(".csv")


def plot_data(runs: Sequence[RunData], rows: Sequence[dict]) -> dict[str, Any]:
    """The numbers each PNG draws, keyed by panel; a panel without data is left out and named in ``skipped``."""
    labels = [r["label"] for r in rows]
    panels: dict[str, Any] = {
        "reward_curves": {row["label"]: {"key": row["reward_key"], "points": run.history.get(row["reward_key"] or "")}
                          for run, row in zip(runs, rows) if run.history.get(row["reward_key"] or "")},
        "job_scores": {row["label"]: run.history["job_hidden_score"]
                       for run, row in zip(runs, rows) if run.history.get("job_hidden_score")},
        "stages": {s: [r[s] for r in rows] for s in STAGE_KEYS},
        "switch_rates": {"switch_rate": [r["switch_rate"] for r in rows]},
        "adoption": {t: [r[f"adoption_{t}"] for r in rows] for t in ADOPTION_TYPES},
        "cost": {"usd_per_reward": [r["usd_per_reward"] for r in rows]},
    }
    data: dict[str, Any] = {"legend": {r["label"]: {"run": r["run"], "run_id": r["run_id"], **r["settings"]}
                                       for r in rows}, "skipped": {}}
    for key, panel in panels.items():
        if key not in ("reward_curves", "job_scores"):  # bar panels: a series no run has is not drawn
            panel = {k: v for k, v in panel.items() if any(x is not None for x in v)}
        if not panel:
            data["skipped"][key] = NO_DATA[key]
            continue
        if key not in ("reward_curves", "job_scores"):
            panel = {"runs": labels, **panel}
        data[key] = panel
    if "cost" in data:  # the USD behind the ratio, for reading (not drawn)
        data["cost"]["usd"] = [r["usd"] for r in rows]
    return data


def _bars(ax, labels, series: dict[str, list], title: str) -> None:
    import numpy as np

    x = np.arange(len(labels))
    width = 0.8 / max(1, len(series))
    for i, (name, vals) in enumerate(series.items()):
        ax.bar(x + i * width - 0.4 + width / 2, [math.nan if v is None else v for v in vals], width, label=name)
    ax.set_xticks(x, labels, rotation=20, ha="right", fontsize=8)
    ax.set(title=title)
    ax.grid(alpha=0.3, axis="y")
    if len(series) > 1:
        ax.legend(fontsize=8)
    else:
        ax.set_ylabel(next(iter(series)))


def write_plots(data: dict[str, Any], folder: Path, note: Note = print) -> list[Path]:
    """reward_curves.png, stages.png, switches.png, adoption.png, cost.png: those ``plot_data`` has panels for."""
    from agent_trainer.outer_loop.report.plots import pyplot, save_figure

    plt = pyplot()
    paths = []
    skipped = data.get("skipped", {})
    curves = [k for k in ("reward_curves", "job_scores") if k in data]
    for k in ("reward_curves", "job_scores"):
        if k in skipped and curves:
            note(f"reward_curves.png: no {k.replace('_', ' ')} panel: {skipped[k]}")
    if curves:
        fig, axes = plt.subplots(1, len(curves), figsize=(5.5 * len(curves) + 0.5, 4), squeeze=False)
        for a, k in zip(axes[0], curves):
            for name, c in data[k].items():
                pts = c["points"] if k == "reward_curves" else c
                a.plot([s for s, _ in pts], [v for _, v in pts], marker="o",
                       label=f"{name} ({c['key']})" if k == "reward_curves" else name)
            if k == "reward_curves":
                a.set(xlabel="step", ylabel="reward", title="Reward per step")
            else:
                a.set(xlabel="job", ylabel="hidden score", title="Hidden score per job")
            a.xaxis.get_major_locator().set_params(integer=True)
            a.grid(alpha=0.3)
            if len(data[k]) > 3:   # below the panel: inside, so many entries would cover the curves
                a.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
            else:
                a.legend(fontsize=7)
        paths.append(save_figure(fig, folder / "reward_curves.png"))
    else:
        _not_written(folder / "reward_curves.png", skipped["reward_curves"], note)
    for key, title, file in (("stages", "Reward stages", "stages.png"),
                             ("switch_rates", "Strategy switch rate", "switches.png"),
                             ("adoption", "Suggestion adoption rate", "adoption.png"),
                             ("cost", "Cost per unit of reward (USD)", "cost.png")):
        if key not in data:
            _not_written(folder / file, skipped[key], note)
            continue
        d = data[key]
        series = {k: v for k, v in d.items() if k not in ("runs", "usd")}
        fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(d["runs"]) + 3), 4))
        _bars(ax, d["runs"], series, title)
        paths.append(save_figure(fig, folder / file))
    return paths


def _not_written(path: Path, why: str, note: Note) -> None:
    path.unlink(missing_ok=True)  # an earlier comparison's PNG in the same folder would mislead
    note(f"{path.name} not written: {why}")


def write_report(runs: Sequence[RunData], rows: Sequence[dict], folder: str | Path,
                 note: Note = print) -> dict[str, Path]:
    """Every table, plot and the plot data into ``folder``; returns the paths by name (PNGs that were drawn)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    keys = [k for k in (rows[0].get("settings", {}) if rows else {}) if k not in COLUMNS]
    md, csv_path = write_table(rows, (*COLUMNS[:4], *keys, *COLUMNS[4:]), folder / "compare")
    cmd, ccsv = write_table(config_rows(rows), (CONFIG_COLUMNS[0], *keys, *CONFIG_COLUMNS[1:]), folder / "configs")
    data = plot_data(runs, rows)
    (folder / "plot_data.json").write_text(json.dumps(data, indent=1))
    pngs = write_plots(data, folder, note)
    return {"table": md, "csv": csv_path, "configs": cmd, "configs_csv": ccsv, "plot_data": folder / "plot_data.json",
            **{p.stem: p for p in pngs}}
