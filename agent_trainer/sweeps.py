"""What a run is called and how it ended: MLflow run names and tags, ``run.json``, the table after a sweep.

Every command's run folder holds ``run.json``::

    {"command": "at-train", "run_name": "lora_r=4 · train smoke #0 2026-12-03_13-40-01",
     "status": "ok" | "failed" | "running" | "killed", "error": null, "value": 0.41,
     "overrides": ["experiment=smoke", "outer.lora_r=4"], "swept": {"outer.lora_r": "4"},
     "mlflow_run_id": "...", "tracking_uri": "sqlite:///...", "folder": "runs/<id>/0"}

``overrides`` are the job's overrides as typed (what ``rerun=<folder>`` replays); ``swept`` the ones
a multirun varied (a sweep on the command line, or a sweeper's choice). After a multirun,
``SweepSummary`` (a Hydra callback in configs/config.yaml) prints a table of the jobs, writes
``sweep.md``/``sweep.json`` into the sweep folder, and the command exits 1 when a job failed.
"""

from __future__ import annotations

import functools
import getpass
import json
import logging
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_trainer.paths import PROJECT_ROOT

RUN_FILE = "run.json"
SWEEP_FILE = "sweep.json"
# Set by cli.main for the jobs of this command (the joblib/submitit workers inherit them):
CLI_OVERRIDES_ENV = "AGENT_TRAINER_CLI_OVERRIDES"  # JSON list: the command line's overrides, as Hydra got them
TYPED_ENV = "AGENT_TRAINER_TYPED_OVERRIDES"  # JSON {override as Hydra got it: as typed}
COMMAND_LINE_ENV = "AGENT_TRAINER_COMMAND_LINE"  # the command line as typed
RERUN_ENV = "AGENT_TRAINER_RERUN_OF"  # the folder a rerun= replays

# Filled by SweepSummary.on_multirun_end in the process that launched the sweep.
last_sweep: list[dict[str, Any]] = []


@dataclass
class JobInfo:
    """Where a job stands in its command: single run or one job of a multirun."""

    command: str
    folder: Path | None
    multirun: bool = False
    num: int | None = None
    sweep_dir: Path | None = None
    overrides: list[str] = field(default_factory=list)  # as typed
    swept: dict[str, str] = field(default_factory=dict)
    experiment: str | None = None

    @property
    def sweep_id(self) -> str | None:
        return self.sweep_dir.name if self.multirun and self.sweep_dir is not None else None


def _env_json(name: str, default: Any) -> Any:
    try:
        return json.loads(os.environ.get(name) or "null") or default
    except ValueError:
        return default


def job_info(command: str) -> JobInfo:
    """This job's place, read from Hydra's runtime config (a plain ``run(cfg)`` call: no sweep, no folder)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return JobInfo(command, None)
    hc = HydraConfig.get()
    typed = _env_json(TYPED_ENV, {})
    given = list(hc.overrides.task)
    multirun = hc.mode == RunMode.MULTIRUN
    swept = swept_of(given, _env_json(CLI_OVERRIDES_ENV, [])) if multirun else {}
    return JobInfo(
        command=command, folder=Path(hc.runtime.output_dir), multirun=multirun,
        num=int(hc.job.num) if multirun and hc.job.get("num") is not None else None,
        sweep_dir=Path(hc.sweep.dir) if multirun else None,
        overrides=[typed.get(o, o) for o in given], swept=swept,
        experiment=hc.runtime.choices.get("experiment"),
    )


def swept_of(job_overrides: list[str], on_line: list[str]) -> dict[str, str]:
    """``{key: value}`` of a sweep job's overrides that the sweep chose: a key swept on the command line
    (``outer.lora_r=4,8``) or set by the sweeper alone (Optuna's search space), not one given a single value
    there (Hydra may write that one back escaped: ``sqlite\\:////x.db``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    fixed = set()
    for o in on_line:
        try:
            (parsed,) = OverridesParser.create().parse_overrides([o])
        except Exception:  # noqa: BLE001 - not Hydra syntax (a flag): it fixes no key
            continue
        if not parsed.is_sweep_override():
            fixed.add(parsed.get_key_element().lstrip("+~"))
    swept = {}
    for o in job_overrides:
        key, eq, value = o.partition("=")
        if eq and key.lstrip("+~") not in fixed:
            swept[key.lstrip("+~")] = value
    return swept


def short_settings(swept: dict[str, str]) -> list[str]:
    """``{"outer.lora_r": "4", "seed": "1"}`` -> ``["lora_r=4", "seed=1"]`` (the full key where the last part
    repeats)."""
    lasts = [k.rsplit(".", 1)[-1] for k in swept]
    return [f"{k.rsplit('.', 1)[-1] if lasts.count(k.rsplit('.', 1)[-1]) == 1 else k}={v}" for k, v in swept.items()]


def run_name(info: JobInfo, label: str | None = None) -> str:
    """``lora_r=4 · train smoke #0 2026-12-03_13-40-01``: unique per run; what differs comes first (the MLflow UI
    cuts long names at the end)."""
    what = label or info.command.removeprefix("at-")
    parts = [*short_settings(info.swept), "·"] if info.swept else []
    parts.append(what)
    if info.experiment and not any(k == "experiment" for k in info.swept):
        parts.append(info.experiment)
    if info.num is not None:
        parts.append(f"#{info.num}")
    top = info.sweep_dir if info.multirun else info.folder
    if top is not None:
        parts.append(top.name.removesuffix("_" + info.command.removeprefix("at-")))
    return " ".join(parts)


@functools.lru_cache(maxsize=1)
def git_state(root: Path = PROJECT_ROOT) -> dict[str, str]:
    """The checkout's commit, branch and dirty flag (empty when the code is not a git checkout)."""
    try:
        import git

        repo = git.Repo(root, search_parent_directories=False)
        out = {"mlflow.source.git.commit": repo.head.commit.hexsha,
               "git.dirty": str(repo.is_dirty(untracked_files=False)).lower()}
        if not repo.head.is_detached:
            out["mlflow.source.git.branch"] = repo.active_branch.name
        return out
    except Exception:  # not a checkout, no git binary, a broken repository: nothing to record
        return {}


def run_tags(info: JobInfo) -> dict[str, str]:
    """MLflow tags that say where a run came from and which sweep it belongs to."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment (some containers)
        user = str(os.getuid())
    tags = {"command": info.command, "mlflow.source.name": info.command, "mlflow.source.type": "LOCAL",
            "mlflow.user": user,
            "command_line": os.environ.get(COMMAND_LINE_ENV) or " ".join([info.command, *info.overrides]),
            "overrides": " ".join(info.overrides), **git_state()}
    if info.folder is not None:
        tags["run_dir"] = str(info.folder)
    if info.multirun:
        tags.update({"sweep": info.sweep_id or "", "sweep.job": str(info.num), "sweep.keys": ",".join(info.swept),
                     **{f"sweep.{k}": v for k, v in info.swept.items()}})
    if os.environ.get(RERUN_ENV):
        tags["rerun_of"] = os.environ[RERUN_ENV]
    return tags


def write_run_file(folder: Path, /, **fields: Any) -> dict[str, Any]:
    """Merge ``fields`` into ``<folder>/run.json`` (written atomically); returns the whole record."""
    path = Path(folder) / RUN_FILE
    record = read_run_file(folder) or {}
    record.update(fields)
    tmp = path.with_name(f".{RUN_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return record


def read_run_file(folder: Path) -> dict[str, Any] | None:
    """``<folder>/run.json`` as a dict, or None when absent or unreadable."""
    try:
        return json.loads((Path(folder) / RUN_FILE).read_text())
    except (OSError, ValueError):
        return None


# What a sweep job that continued another run (``at-train -m ... resume=true``) reads from that run's run.json.
CONTINUED_KEYS = ("status", "error", "value", "value_name", "jobs", "jobs_crashed")


def sweep_rows(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per job folder of a sweep (numbered sub-folders), from their ``run.json``."""
    rows = []
    jobs = sorted((p for p in Path(sweep_dir).iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    for job in jobs:
        rec = read_run_file(job) or {"status": "failed", "error": f"no {RUN_FILE}: the job ended before it started"}
        where = str(job)
        if rec.get("continued"):   # a job that resumed another run: the outcome is in that run's folder
            outcome = read_run_file(Path(rec["continued"])) or {}
            rec = {**rec, **{k: outcome[k] for k in CONTINUED_KEYS if k in outcome}}
            where = f"{job} (continued {rec['continued']})"
        rows.append({"job": int(job.name), "status": rec.get("status", "?"), "value": rec.get("value"),
                     "settings": " ".join(short_settings(rec.get("swept") or {}))
                                 or " ".join(rec.get("overrides") or []),
                     "folder": where, "log": rec.get("log"), "error": rec.get("error"),
                     "run_name": rec.get("run_name"), "value_name": rec.get("value_name"),
                     "jobs_crashed": rec.get("jobs_crashed"), "jobs": rec.get("jobs")})
    return rows


def sweep_table(rows: list[dict[str, Any]]) -> str:
    """The jobs of a sweep as a markdown table."""
    def fmt(v: Any, width: int = 160) -> str:
        text = "-" if v is None else f"{v:.4f}" if isinstance(v, float) else " ".join(str(v).replace("|", "/").split())
        return text if len(text) <= width else text[: width - 3] + "..."

    names = {r.get("value_name") for r in rows if r.get("value_name")}
    value = f"value ({names.pop().rsplit('/', 1)[-1]})" if len(names) == 1 else "value"
    crashed = any(r.get("jobs_crashed") is not None for r in rows)   # commands that run inner jobs (at-train)
    jobs_head = "crashed inner jobs | " if crashed else ""
    lines = [f"| job | status | {value} | {jobs_head}settings | folder | error |",
             "|---|---|---|" + ("---|" if crashed else "") + "---|---|---|"]
    for r in rows:
        where = r["folder"] + (f" (log: {r['log']})" if r.get("log") else "")
        jobs = (f"{r['jobs_crashed']} of {r['jobs']} | " if r.get("jobs_crashed") is not None else "- | ") \
            if crashed else ""
        lines.append(f"| {r['job']} | {r['status']} | {fmt(r['value'])} | {jobs}{fmt(r['settings'])} | {where} | "
                     f"{fmt(r['error'])} |")
    return "\n".join(lines)


from hydra.experimental.callback import Callback
from hydra.experimental.callbacks import PickleJobInfoCallback


class SaveJobInfo(PickleJobInfoCallback):
    """Hydra's ``.hydra/config.pickle`` (for ``--experimental-rerun``), without its INFO lines on the console."""

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        self.log.setLevel(logging.WARNING)   # here, not once: a launcher's worker process configures logging anew
        super().on_job_start(config, **kwargs)

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        """The return value's pickle, unless the job removed its folder (a resume's or a discarded one's)."""
        if self.output_dir.parent.is_dir():
            super().on_job_end(config, job_return, **kwargs)

    def _save_pickle(self, obj: Any, filename: str, output_dir: Path) -> None:
        """Pickled whole, or with its configs as plain nodes where a launcher's process re-imported their schema
        classes (joblib's workers: "not the same object as ..."); never a half-written file."""
        import pickle

        try:
            data = pickle.dumps(obj, protocol=4)
        except (pickle.PicklingError, TypeError, AttributeError):
            data = pickle.dumps(_plain_configs(obj), protocol=4)
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / filename).write_bytes(data)


def _plain_configs(obj: Any) -> Any:
    """A config (or a ``JobReturn``'s configs) as untyped nodes with the same values."""
    import dataclasses

    from omegaconf import DictConfig, OmegaConf

    if isinstance(obj, DictConfig):
        return OmegaConf.create(OmegaConf.to_container(obj, resolve=False))
    if dataclasses.is_dataclass(obj):
        return dataclasses.replace(obj, **{f.name: _plain_configs(getattr(obj, f.name))
                                           for f in dataclasses.fields(obj)
                                           if f.init and isinstance(getattr(obj, f.name), DictConfig)})
    return obj


class SweepSummary(Callback):
    """Hydra callback: after a multirun, print and save the table of its jobs (ok / failed, value, settings)."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not sweep_dir.is_dir():
            return
        stray = sweep_dir / ".submitit" / "%j"  # the submitit plugin creates its folder template once
        if stray.is_dir() and not any(stray.iterdir()):
            shutil.rmtree(stray, ignore_errors=True)
        rows = sweep_rows(sweep_dir)
        last_sweep[:] = rows
        failed = [r for r in rows if r["status"] != "ok"]
        table = sweep_table(rows)
        (sweep_dir / "sweep.md").write_text(table + "\n")
        (sweep_dir / SWEEP_FILE).write_text(json.dumps(rows, indent=2, default=str) + "\n")
        head = f"sweep {sweep_dir}: {len(rows) - len(failed)} ok, {len(failed)} failed"
        print(f"\n{head}\n{table}", file=sys.stdout, flush=True)


def guard_optuna_search() -> None:
    """An Optuna search whose every trial failed ends with the table of its jobs and one line (exit 1).

    hydra-optuna-sweeper 1.3 asks ``study.best_trial`` after the last trial, which raises "No trials are completed
    yet." before Hydra's end-of-sweep callbacks run: no table, and a traceback. Its ``sweep`` is wrapped here
    (the plugin's class; Hydra only takes sweepers from its ``hydra_plugins`` package)."""
    try:
        from hydra_plugins.hydra_optuna_sweeper._impl import OptunaSweeperImpl
    except ImportError:  # the sweep extra is not installed: Hydra says so when the search starts
        return
    if getattr(OptunaSweeperImpl.sweep, "guarded", False):
        return
    original = OptunaSweeperImpl.sweep

    def sweep(self, arguments):
        try:
            return original(self, arguments)
        except ValueError as e:
            if "No trials are completed" not in str(e):
                raise
            SweepSummary().on_multirun_end(self.config)
            print(f"{Path(sys.argv[0]).name}: error: the search completed no trial ({len(last_sweep)} failed; table "
                  f"above): no best settings", file=sys.stderr, flush=True)
            sys.exit(1)

    sweep.guarded = True
    OptunaSweeperImpl.sweep = sweep

