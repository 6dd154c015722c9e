"""Compare runs: tables (per run, per setting) and PNG plots, read back from MLflow.

    >>> runs = collect("sqlite:///runs/mlflow.db", ["<mlflow run id>", "runs/<sweep>", "runs/<sweep>/3"])
    >>> rows = run_rows(runs)            # grouped by the params that differ between the runs
    >>> write_report(runs, rows, "runs/<compare run>")   # compare.md/.csv, configs.md/.csv, *.png, plot_data.json

What ``collect`` takes, mixed freely (plus ``experiments``: the top-level runs of experiments):

- an MLflow run id (a fork's parent brings its branches);
- a run folder (absolute, relative to the cwd or the project root, or a run_id under ``runs_dir``):
  its ``run.json`` (else at-train's ``outer_run.json``) names the MLflow run and its ``tracking_uri``;
- a sweep folder: each numbered run sub-folder (``0/``, ``1/``, ...) in job order; a job without an
  MLflow run (it failed before logging) is skipped with a note.

Numbers come only from MLflow (each run's latest metric values and metric histories; params for
the settings), so a comparison can be redone from the tracking server alone. Metric names are read
with or without at-train's group prefix (``reward/reward_mean`` is ``reward_mean``:
``agent_trainer.tracking.bare_key``). Runs of different commands log different names for the same
thing; the first name a run has wins:

- reward: ``reward_mean`` (at-train, per outer step) | ``reward_total`` (at-episode, a fork branch);
- stages: ``validation_mean`` | ``reward_validation``, and the same for job success, quality, speed;
- switches: ``switch_rate``, ``switches``, ``pairs``, ``first_switch`` (``outer_loop.strategy``);
- adoption: ``adoption_execution``, ``adoption_strategy`` with ``suggestions_*`` / ``adopted_*``;
- cost: ``usd_cumulative`` | ``usd``; cost per unit of reward = USD / reward (only for reward > 0).

Settings: ``differing_keys`` are the params (flattened configs: ``outer.lora_r``, ``seed``) whose
values differ between runs that log them, less those that say nothing about the setting
(``IGNORED_KEYS``, ``hydra.*``, ``tracking.*``). They are the default grouping (else
``DEFAULT_GROUP_BY``), a table column each, and the plot legends (``lora_r=4``: the last dotted part
where unambiguous; the run name when nothing differs).

A panel no run has data for is not drawn and a PNG without panels is not written; ``plot_data.json``
holds exactly the numbers each PNG draws (tests compare them with MLflow's) and, under ``skipped``,
why a panel is missing.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from agent_trainer.paths import PROJECT_ROOT, resolve_path
from agent_trainer.tracking import bare_key

REWARD_KEYS = ("reward_mean", "reward_total")
# Metrics read with their whole history (the rest: latest value only); the held-out and choice ones are
# the seed report's (outer_loop.seed_report).
HISTORY_KEYS = (*REWARD_KEYS, "job_hidden_score", "heldout_reward_mean", "heldout_reward_lo", "heldout_reward_hi",
                "share_algorithm_sft", "valid_first_try")
STAGE_KEYS = {"validation": ("validation_mean", "reward_validation"),
              "job_success": ("job_success_rate", "reward_job_success"),
              "quality": ("quality_mean", "reward_quality"), "speed": ("speed_mean", "reward_speed")}
COST_KEYS = ("usd_cumulative", "usd")
SWITCH_KEYS = ("switch_rate", "switches", "pairs", "first_switch")
ADOPTION_TYPES = ("execution", "strategy")
# The settings columns (one per grouping param) go between "command" and "config".
COLUMNS = ("run", "run_id", "command", "config", "reward", "validation", "job_success", "quality", "speed",
           "switch_rate", "switches", "pairs", "first_switch", "adoption_execution", "adoption_strategy", "usd",
           "usd_per_reward")
CONFIG_COLUMNS = ("config", "runs", "reward_mean", "switch_rate", "pairs", "adoption_execution", "adoption_strategy",
                  "usd", "usd_per_reward")
DEFAULT_GROUP_BY = ("agent.model", "strategy.mode")
# Params that differ from run to run without saying anything about the setting (branch.message follows branch).
IGNORED_KEYS = frozenset({"run_id", "resume", "rerun", "dry_run", "out", "runs", "experiments", "runs_dir",
                          "cache_dir", "branch.message"})
IGNORED_PREFIXES = ("hydra.", "tracking.")
RUN_FILES = ("run.json", "outer_run.json")  # run.json (every command) first, at-train's marker as the fallback
# Why a panel is missing (plot_data.json "skipped", the printed notes).
NO_DATA = {"reward_curves": "no run logged a reward per step (reward_mean or reward_total)",
           "job_scores": "no run logged a hidden score per job (job_hidden_score)",
           "stages": "no run logged a reward stage (validation, job success, quality, speed)",
           "switch_rates": "no run logged a strategy switch rate (switch_rate: episodes of several jobs)",
           "adoption": "no run logged suggestion adoption (adoption_*: an evaluator's suggestions)",
           "cost": "no run logged USD with a positive reward (usd_cumulative or usd)"}

Note = Callable[[str], None]


class CompareError(ValueError):
    """Runs, folders or experiments that cannot be read; the message says which."""


@dataclass
class RunData:
    run_id: str
    name: str
    command: str
    params: dict[str, str]
    metrics: dict[str, float]                               # latest value of each metric, bare names
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    tracking_uri: str = ""
    folder: str | None = None                               # the run folder it was named by, if any

    def first(self, keys: Sequence[str]) -> tuple[str | None, float | None]:
        for k in keys:
            if k in self.metrics:
                return k, self.metrics[k]
        return None, None


@dataclass
class RunRef:
    """One MLflow run to read, and the run folder that named it (None for a run id)."""

    run_id: str
    tracking_uri: str
    folder: Path | None = None


# --- what to compare ----------------------------------------------------------------------------


def resolve(entries: Sequence[str], tracking_uri: str, runs_dir: str | Path | None = None,
            note: Note = print) -> list[RunRef]:
    """MLflow run ids, run folders and sweep folders -> the MLflow runs they stand for, in order (no MLflow call)."""
    refs: list[RunRef] = []
    for entry in map(str, entries):
        folder = _find_folder(entry, runs_dir)
        if folder is None:
            if "/" in entry or "\\" in entry or entry.startswith((".", "~")):
                raise CompareError(f"runs entry {entry!r}: no such folder ({_where(runs_dir)}); "
                                   f"give a run folder, a sweep folder or an MLflow run id")
            refs.append(RunRef(entry, tracking_uri))
            continue
        jobs = [folder]
        if not any((folder / f).is_file() for f in RUN_FILES):
            jobs = sorted((p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
            if not jobs:
                raise CompareError(f"{folder}: not a run folder (no {' or '.join(RUN_FILES)}) nor a sweep folder "
                                   f"(no numbered run sub-folders 0/, 1/, ...)")
        for job in jobs:
            ref = _folder_ref(job, tracking_uri, note)
            if ref is not None:
                refs.append(ref)
    return refs


def _find_folder(entry: str, runs_dir: str | Path | None) -> Path | None:
    path = resolve_path(entry)
    if path.is_dir():
        return path.resolve()
    if runs_dir is not None and not Path(entry).expanduser().is_absolute() and (Path(runs_dir) / entry).is_dir():
        return (Path(runs_dir) / entry).resolve()
    return None


def _where(runs_dir: str | Path | None) -> str:
    places = [str(Path.cwd()), str(PROJECT_ROOT)] + ([str(runs_dir)] if runs_dir is not None else [])
    return "looked in " + ", ".join(dict.fromkeys(places))


def _folder_ref(folder: Path, tracking_uri: str, note: Note) -> RunRef | None:
    """The MLflow run of a run folder; None (with a note) for a job that has none."""
    records = []
    for name in RUN_FILES:
        try:
            records.append(json.loads((folder / name).read_text()))
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            raise CompareError(f"{folder / name}: unreadable ({e}); repair or remove it") from None
    records = [r for r in records if isinstance(r, dict)]
    if not records:
        note(f"skipped {folder}: no {' or '.join(RUN_FILES)} (the job ended before it started, or predates run.json)")
        return None
    run_id = next((r["mlflow_run_id"] for r in records if r.get("mlflow_run_id")), None)
    if run_id is None:
        rec = records[0]
        why = rec.get("error") or ("tracking was off" if rec.get("status") == "ok" else f"status {rec.get('status')}")
        note(f"skipped {folder}: no MLflow run ({why})")
        return None
    uri = next((r["tracking_uri"] for r in records if r.get("tracking_uri")), tracking_uri)
    return RunRef(str(run_id), str(uri), folder)


def _client(uri: str):
    """An MLflow client that reads ``uri``; a missing SQLite file or a closed server fails at once."""
    from mlflow import MlflowClient

    from agent_trainer.tracking import TrackingError, check_tracking_uri

    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        raise CompareError(f"no MLflow database at {uri[len('sqlite:///'):]}; give run folders, or the store the "
                           f"runs were logged to: tracking.tracking_uri=sqlite:///<runs folder>/mlflow.db")
    if uri.startswith(("http://", "https://")):
        try:
            check_tracking_uri(uri)
        except TrackingError as e:
            raise CompareError(str(e)) from None
    return MlflowClient(tracking_uri=uri)


def collect(tracking_uri: str, run_ids: Sequence[str] = (), experiments: Sequence[str] = (),
            runs_dir: str | Path | None = None, note: Note = print) -> list[RunData]:
    """The runs named (ids, run folders, sweep folders), the top-level runs of the experiments, fork branches."""
    from mlflow.exceptions import MlflowException

    clients: dict[str, Any] = {}

    def client(uri: str):
        if uri not in clients:
            clients[uri] = _client(uri)
        return clients[uri]

    found: list[tuple[str, Any, Path | None]] = []
    for ref in resolve(run_ids, tracking_uri, runs_dir, note):
        try:
            found.append((ref.tracking_uri, client(ref.tracking_uri).get_run(ref.run_id), ref.folder))
        except MlflowException:
            if ref.folder is not None:
                raise CompareError(f"{ref.folder}: its MLflow run {ref.run_id} is not in {ref.tracking_uri} "
                                   f"(deleted, or the store moved)") from None
            raise CompareError(f"runs entry {ref.run_id!r} is neither a run folder ({_where(runs_dir)}) "
                               f"nor an MLflow run in {ref.tracking_uri}") from None
    for name in experiments:
        c = client(tracking_uri)
        exp = c.get_experiment_by_name(str(name))
        if exp is None:
            known = [e.name for e in c.search_experiments()]
            raise CompareError(f"no MLflow experiment {name!r}; known: {', '.join(known) or 'none'}")
        found += [(tracking_uri, r, None)
                  for r in c.search_runs([exp.experiment_id], max_results=5000, order_by=["attributes.start_time"])
                  if "mlflow.parentRunId" not in r.data.tags and r.data.tags.get("command") != "at-compare"]
    out: list[RunData] = []
    seen: set[tuple[str, str]] = set()
    for uri, r, folder in found:
        # A fork's parent holds no numbers of its own: its branches stand for it.
        fork = r.data.tags.get("command") == "at-fork"
        for run in _children(client(uri), r) if fork else [r]:
            if (uri, run.info.run_id) in seen:
                continue
            seen.add((uri, run.info.run_id))
            out.append(_data(client(uri), run, uri, None if fork or folder is None else str(folder)))
    if not out:
        raise CompareError("nothing to compare: give runs=[<MLflow run id | run folder | sweep folder>, ...] "
                           "or experiments=[<name>, ...]")
    names = [r.name for r in out]
    for r in out:  # the run column must tell runs apart
        if names.count(r.name) > 1:
            r.name = f"{r.name}#{r.run_id[:6]}"
    return out


def _children(client, parent) -> list[Any]:
    return client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
                              order_by=["attributes.start_time"])


def _data(client, run, uri: str, folder: str | None) -> RunData:
    tags = run.data.tags
    # Grouped names (reward/reward_mean) win over bare ones when a run has both (old steps, then new).
    logged = {bare_key(k): k for k in sorted(run.data.metrics, key=lambda k: bare_key(k) != k)}
    metrics = {b: run.data.metrics[k] for b, k in logged.items()}
    history = {b: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, logged[b]))
               for b in HISTORY_KEYS if b in logged}
    name = tags.get("mlflow.runName") or run.info.run_name or run.info.run_id[:8]
    return RunData(run.info.run_id, name, tags.get("command", "-"), dict(run.data.params), metrics, history,
                   uri, folder)


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
        row: dict[str, Any] = {"run": r.name, "run_id": r.run_id, "command": r.command, "reward": reward,
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
        pairs = sum(r["pairs"] or 0 for r in rs)
        usd = sum(r["usd"] or 0.0 for r in rs)
        row = {"config": cfg, "settings": rs[0].get("settings", {}), "runs": len(rs),
               "reward_mean": sum(rewards) / len(rewards) if rewards else None,
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
    from outer_loop.plots import pyplot, save_figure

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
    md, csv_path = write_table(rows, (*COLUMNS[:3], *keys, *COLUMNS[3:]), folder / "compare")
    cmd, ccsv = write_table(config_rows(rows), (CONFIG_COLUMNS[0], *keys, *CONFIG_COLUMNS[1:]), folder / "configs")
    data = plot_data(runs, rows)
    (folder / "plot_data.json").write_text(json.dumps(data, indent=1))
    pngs = write_plots(data, folder, note)
    return {"table": md, "csv": csv_path, "configs": cmd, "configs_csv": ccsv, "plot_data": folder / "plot_data.json",
            **{p.stem: p for p in pngs}}
