"""Compare MLflow runs: tables (per run, per agent configuration) and PNG plots, read back from MLflow.

    >>> runs = collect("sqlite:///runs/mlflow.db", run_ids=["<id>", "<id>"])   # a fork parent brings its branches
    >>> rows = run_rows(runs, group_by=("agent.model", "strategy.mode"))
    >>> write_report(runs, rows, "runs/<compare run>")   # compare.md/.csv, configs.md/.csv, *.png, plot_data.json

Numbers come only from MLflow (each run's latest metric values and metric histories; params for
the grouping), so a comparison can be redone from the tracking server alone. Runs of different
commands log different names for the same thing; the first name a run has wins:

- reward: ``reward_mean`` (at-train, per outer step) | ``reward_total`` (at-episode, a fork branch);
- stages: ``validation_mean`` | ``reward_validation``, and the same for job success, quality, speed;
- switches: ``switch_rate``, ``switches``, ``pairs``, ``first_switch`` (``outer_loop.strategy``);
- adoption: ``adoption_execution``, ``adoption_strategy`` with ``suggestions_*`` / ``adopted_*``;
- cost: ``usd_cumulative`` | ``usd``; cost per unit of reward = USD / reward (only for reward > 0).

``plot_data.json`` holds exactly the numbers each PNG draws (tests compare them with MLflow's).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

REWARD_KEYS = ("reward_mean", "reward_total")
STAGE_KEYS = {"validation": ("validation_mean", "reward_validation"),
              "job_success": ("job_success_rate", "reward_job_success"),
              "quality": ("quality_mean", "reward_quality"), "speed": ("speed_mean", "reward_speed")}
COST_KEYS = ("usd_cumulative", "usd")
SWITCH_KEYS = ("switch_rate", "switches", "pairs", "first_switch")
ADOPTION_TYPES = ("execution", "strategy")
COLUMNS = ("run", "run_id", "command", "config", "reward", "validation", "job_success", "quality", "speed",
           "switch_rate", "switches", "pairs", "first_switch", "adoption_execution", "adoption_strategy", "usd",
           "usd_per_reward")


class CompareError(ValueError):
    """Runs or experiments that cannot be read; the message says which."""


@dataclass
class RunData:
    run_id: str
    name: str
    command: str
    params: dict[str, str]
    metrics: dict[str, float]                               # latest value of each metric
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    def first(self, keys: Sequence[str]) -> tuple[str | None, float | None]:
        for k in keys:
            if k in self.metrics:
                return k, self.metrics[k]
        return None, None


def collect(tracking_uri: str, run_ids: Sequence[str] = (), experiments: Sequence[str] = ()) -> list[RunData]:
    """The runs named, the top-level runs of the experiments named, and the branches of any fork among them."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=tracking_uri)
    found: list[Any] = []
    for rid in run_ids:
        try:
            found.append(client.get_run(str(rid)))
        except MlflowException:
            raise CompareError(f"no MLflow run {rid!r} at {tracking_uri}") from None
    for name in experiments:
        exp = client.get_experiment_by_name(str(name))
        if exp is None:
            known = [e.name for e in client.search_experiments()]
            raise CompareError(f"no MLflow experiment {name!r}; known: {', '.join(known) or 'none'}")
        found += [r for r in client.search_runs([exp.experiment_id], max_results=5000, order_by=["attributes.start_time"])
                  if "mlflow.parentRunId" not in r.data.tags and r.data.tags.get("command") != "at-compare"]
    out: list[RunData] = []
    seen: set[str] = set()
    for r in found:
        # A fork's parent holds no numbers of its own: its branches stand for it.
        fork = r.data.tags.get("command") == "at-fork"
        for run in _children(client, r) if fork else [r]:
            if run.info.run_id in seen:
                continue
            seen.add(run.info.run_id)
            out.append(_data(client, run))
    if not out:
        raise CompareError("nothing to compare: give runs=[<run id>, ...] or experiments=[<name>, ...]")
    names = [r.name for r in out]
    for r in out:  # labels of plots and tables must tell runs apart
        if names.count(r.name) > 1:
            r.name = f"{r.name}#{r.run_id[:6]}"
    return out


def _children(client, parent) -> list[Any]:
    return client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
                              order_by=["attributes.start_time"])


def _data(client, run) -> RunData:
    tags = run.data.tags
    metrics = dict(run.data.metrics)
    history = {k: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, k))
               for k in (*REWARD_KEYS, "job_hidden_score") if k in metrics}
    name = tags.get("mlflow.runName") or run.info.run_name or run.info.run_id[:8]
    return RunData(run.info.run_id, name, tags.get("command", "-"), dict(run.data.params), metrics, history)


def run_rows(runs: Sequence[RunData], group_by: Sequence[str] = ("agent.model", "strategy.mode")) -> list[dict]:
    """One row per run (``COLUMNS``)."""
    rows = []
    for r in runs:
        reward_key, reward = r.first(REWARD_KEYS)
        _, usd = r.first(COST_KEYS)
        row: dict[str, Any] = {"run": r.name, "run_id": r.run_id, "command": r.command, "reward": reward,
                               "reward_key": reward_key, "usd": usd,
                               "config": " ".join(f"{k}={r.params.get(k, '-')}" for k in group_by)}
        if r.params.get("branch"):
            row["config"] += f" branch={r.params['branch']}"
        for stage, keys in STAGE_KEYS.items():
            row[stage] = r.first(keys)[1]
        for k in SWITCH_KEYS:
            row[k] = r.metrics.get(k)
        for t in ADOPTION_TYPES:
            row[f"adoption_{t}"] = r.metrics.get(f"adoption_{t}")
            row[f"suggestions_{t}"] = r.metrics.get(f"suggestions_{t}")
            row[f"adopted_{t}"] = r.metrics.get(f"adopted_{t}")
        row["usd_per_reward"] = usd / reward if usd is not None and reward else None
        if reward is not None and reward <= 0:
            row["usd_per_reward"] = None
        rows.append(row)
    return rows


def config_rows(rows: Sequence[dict]) -> list[dict]:
    """Per agent configuration: runs, mean reward, pooled switch rate and adoption, cost per unit of reward."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["config"], []).append(r)
    out = []
    for cfg, rs in groups.items():
        rewards = [r["reward"] for r in rs if r["reward"] is not None]
        pairs = sum(r["pairs"] or 0 for r in rs)
        usd = sum(r["usd"] or 0.0 for r in rs)
        row = {"config": cfg, "runs": len(rs), "reward_mean": sum(rewards) / len(rewards) if rewards else None,
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
    """``<stem>.md`` (rounded for reading) and ``<stem>.csv`` (full precision)."""
    md = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    md += ["| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |" for r in rows]
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    with open(stem.with_suffix(".csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        w.writerows([{c: ("" if r.get(c) is None else r.get(c)) for c in columns} for r in rows])
    return stem.with_suffix(".md"), stem.with_suffix(".csv")


def plot_data(runs: Sequence[RunData], rows: Sequence[dict]) -> dict[str, Any]:
    """The numbers each PNG draws, keyed by plot (what ``write_report`` draws)."""
    by_id = {r["run_id"]: r for r in rows}
    labels = [r["run"] for r in rows]
    return {
        "reward_curves": {r.name: {"key": by_id[r.run_id]["reward_key"],
                                   "points": r.history.get(by_id[r.run_id]["reward_key"] or "", [])}
                          for r in runs},
        "job_scores": {r.name: r.history.get("job_hidden_score", []) for r in runs},
        "stages": {"runs": labels, **{s: [r[s] for r in rows] for s in STAGE_KEYS}},
        "switch_rates": {"runs": labels, "switch_rate": [r["switch_rate"] for r in rows]},
        "adoption": {"runs": labels, **{t: [r[f"adoption_{t}"] for r in rows] for t in ADOPTION_TYPES}},
        "cost": {"runs": labels, "usd_per_reward": [r["usd_per_reward"] for r in rows],
                 "usd": [r["usd"] for r in rows]},
    }


def _bars(ax, labels, series: dict[str, list], title: str) -> None:
    import numpy as np

    x = np.arange(len(labels))
    width = 0.8 / max(1, len(series))
    for i, (name, vals) in enumerate(series.items()):
        ax.bar(x + i * width - 0.4 + width / 2, [v if v is not None else 0.0 for v in vals], width, label=name)
    ax.set_xticks(x, labels, rotation=20, ha="right", fontsize=8)
    ax.set(title=title)
    ax.grid(alpha=0.3, axis="y")
    if len(series) > 1:
        ax.legend(fontsize=8)


def write_plots(data: dict[str, Any], folder: Path) -> list[Path]:
    """reward_curves.png, stages.png, switches.png, adoption.png, cost.png from ``plot_data``'s numbers."""
    from outer_loop.plots import _plt, _save

    plt = _plt()
    paths = []
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, c in data["reward_curves"].items():
        if c["points"]:
            a1.plot([s for s, _ in c["points"]], [v for _, v in c["points"]], marker="o", label=f"{name} ({c['key']})")
    a1.set(xlabel="step", ylabel="reward", title="Reward per step")
    for name, pts in data["job_scores"].items():
        if pts:
            a2.plot([s for s, _ in pts], [v for _, v in pts], marker="o", label=name)
    a2.set(xlabel="job", ylabel="hidden score", title="Hidden score per job")
    a2.xaxis.get_major_locator().set_params(integer=True)
    for a in (a1, a2):
        a.grid(alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7)
    paths.append(_save(fig, folder / "reward_curves.png"))
    for key, title, file in (("stages", "Reward stages", "stages.png"), ("switch_rates", "Strategy switch rate",
                                                                        "switches.png"),
                             ("adoption", "Suggestion adoption rate", "adoption.png"),
                             ("cost", "Cost per unit of reward (USD)", "cost.png")):
        d = data[key]
        series = {k: v for k, v in d.items() if k != "runs" and not (key == "cost" and k == "usd")}
        fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(d["runs"]) + 3), 4))
        _bars(ax, d["runs"], series, title)
        paths.append(_save(fig, folder / file))
    return paths


def write_report(runs: Sequence[RunData], rows: Sequence[dict], folder: str | Path) -> dict[str, Path]:
    """Every table, plot and the plot data into ``folder``; returns the paths by name."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    md, csv_path = write_table(rows, COLUMNS, folder / "compare")
    cfg_cols = ("config", "runs", "reward_mean", "switch_rate", "pairs", "adoption_execution", "adoption_strategy",
                "usd", "usd_per_reward")
    cmd, ccsv = write_table(config_rows(rows), cfg_cols, folder / "configs")
    data = plot_data(runs, rows)
    (folder / "plot_data.json").write_text(json.dumps(data, indent=1))
    pngs = write_plots(data, folder)
    return {"table": md, "csv": csv_path, "configs": cmd, "configs_csv": ccsv, "plot_data": folder / "plot_data.json",
            **{p.stem: p for p in pngs}}
