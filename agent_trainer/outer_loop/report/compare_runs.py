"""The runs ``at-compare`` compares, read from MLflow: ids, run folders and sweep folders -> ``RunData``.

    >>> runs = collect("sqlite:///runs/mlflow.db", ["<mlflow run id>", "runs/<sweep>", "runs/<sweep>/3"])
    >>> runs[0].metrics["reward_mean"], runs[0].history["reward_mean"], runs[0].params["outer.lr"]

A run folder names its MLflow run in ``run.json`` (else at-train's ``outer_run.json``); a run made with
``tracking=off`` is read from its folder alone (``metrics.jsonl``, ``config.resolved.yaml``, ``run.json``); a sweep
folder stands for its numbered run sub-folders; a fork's parent run for its branches. Tables and plots of
the runs: ``agent_trainer.outer_loop.report.compare``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from agent_trainer.config import TrackingConfig
from agent_trainer.paths import PROJECT_ROOT, resolve_path
from agent_trainer.tracking import bare_key

REWARD_KEYS = ("reward_mean", "reward_total")
# Metrics read with their whole history (the rest: latest value only); the held-out and choice ones are
# the seed report's (agent_trainer.outer_loop.report.seed_report).
HISTORY_KEYS = (*REWARD_KEYS, "job_hidden_score", "heldout_reward_mean", "heldout_reward_lo", "heldout_reward_hi",
                "share_algorithm_sft", "valid_first_try")
RUN_FILES = ("run.json", "outer_run.json")  # run.json (every command) first, at-train's marker as the fallback
METRICS_FILE = "metrics.jsonl"              # at-train's step metrics, bare names, one line a step

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
    status: str = ""                                        # MLflow's: FINISHED, FAILED, KILLED, RUNNING
    value: float | None = None                              # what the command returned (a sweep's value)
    value_name: str | None = None                           # its metric (the run's ``returned`` tag)

    def first(self, keys: Sequence[str]) -> tuple[str | None, float | None]:
        for k in keys:
            if k in self.metrics:
                return k, self.metrics[k]
        return None, None


@dataclass
class RunRef:
    """One MLflow run to read, and the run folder that named it (None for a run id); a run without MLflow
    (``tracking=off``) has ``run_id`` None and its folder's ``run.json`` as ``record``."""

    run_id: str | None
    tracking_uri: str
    folder: Path | None = None
    record: dict | None = None


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
    continued = next((r["continued"] for r in records if r.get("continued")), None)
    if continued and Path(continued).resolve() != folder.resolve():   # a sweep job that resumed another run
        return _folder_ref(Path(continued), tracking_uri, note)
    if not records:
        note(f"skipped {folder}: no {' or '.join(RUN_FILES)} (the job ended before it started, or predates run.json)")
        return None
    run_id = next((r["mlflow_run_id"] for r in records if r.get("mlflow_run_id")), None)
    if run_id is None:
        rec = records[0]
        if (folder / METRICS_FILE).is_file():   # an at-train run with tracking=off: its folder's numbers
            return RunRef(None, tracking_uri, folder, {k: v for r in reversed(records) for k, v in r.items()})
        why = rec.get("error") or ("tracking was off" if rec.get("status") == "ok" else f"status {rec.get('status')}")
        note(f"skipped {folder}: no MLflow run ({why})")
        return None
    uri = next((r["tracking_uri"] for r in records if r.get("tracking_uri")), tracking_uri)
    return RunRef(str(run_id), str(uri), folder)


def _client(uri: str, connect_timeout_s: float):
    """An MLflow client that reads ``uri``; a missing SQLite file or a closed server fails at once."""
    from mlflow import MlflowClient

    from agent_trainer.tracking import TrackingError, check_tracking_uri

    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        raise CompareError(f"no MLflow database at {uri[len('sqlite:///'):]}; give run folders, or the store the "
                           f"runs were logged to: tracking.tracking_uri=sqlite:///<runs folder>/mlflow.db")
    if uri.startswith(("http://", "https://")):
        try:
            check_tracking_uri(uri, connect_timeout_s)
        except TrackingError as e:
            raise CompareError(str(e)) from None
    return MlflowClient(tracking_uri=uri)


def collect(tracking_uri: str, run_ids: Sequence[str] = (), experiments: Sequence[str] = (),
            runs_dir: str | Path | None = None, note: Note = print,
            connect_timeout_s: float = TrackingConfig.connect_timeout_s) -> list[RunData]:
    """The runs named (ids, run folders, sweep folders), the top-level runs of the experiments, fork branches; a
    tracking server must answer within ``connect_timeout_s`` (``tracking.connect_timeout_s``)."""
    from mlflow.exceptions import MlflowException

    clients: dict[str, Any] = {}

    def client(uri: str):
        if uri not in clients:
            clients[uri] = _client(uri, connect_timeout_s)
        return clients[uri]

    found: list[tuple[str, Any, Path | None]] = []
    for ref in resolve(run_ids, tracking_uri, runs_dir, note):
        if ref.run_id is None:
            found.append(("", ref, ref.folder))
            continue
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
        if isinstance(r, RunRef):
            if ("", str(r.folder)) not in seen:
                seen.add(("", str(r.folder)))
                out.append(_folder_data(r.folder, r.record or {}))
            continue
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
    returned = tags.get("returned")
    value = metrics.get(bare_key(returned)) if returned else None
    return RunData(run.info.run_id, name, tags.get("command", "-"), dict(run.data.params), metrics, history,
                   uri, folder, run.info.status, value, returned)


_STATUS = {"ok": "FINISHED", "failed": "FAILED", "killed": "KILLED", "running": "RUNNING"}


def _folder_data(folder: Path, record: dict) -> RunData:
    """A run's numbers from its folder alone (a run made with ``tracking=off``): the last value of each metric and
    the history of ``HISTORY_KEYS`` from ``metrics.jsonl``, the params from ``config.resolved.yaml`` as MLflow
    would hold them, the name, status and returned value from ``run.json``, ``paired_*`` from ``evals/``."""
    from omegaconf import OmegaConf

    from agent_trainer.tracking import flatten, safe_params

    metrics: dict[str, float] = {}
    history: dict[str, dict[int, float]] = {}
    for line in (folder / METRICS_FILE).read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:   # a line cut short by a kill
            continue
        step = int(row.get("step", 0))
        for key, value in row.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            metrics[key] = float(value)
            if key in HISTORY_KEYS:
                history.setdefault(key, {})[step] = float(value)   # a step logged again (a resume): the last
    config = folder / "config.resolved.yaml"
    params = safe_params(flatten(OmegaConf.to_container(OmegaConf.load(config)))) if config.is_file() else {}
    returned = record.get("value_name")
    value = record.get("value") if isinstance(record.get("value"), (int, float)) else None
    if returned and value is not None:
        metrics.setdefault(bare_key(returned), float(value))
    from agent_trainer.outer_loop.rl.policy_eval import saved_metrics

    metrics.update(saved_metrics(folder))   # scripts/policy_eval.py's results, as MLflow would hold them
    steps = {k: sorted(v.items()) for k, v in history.items()}
    return RunData(str(record.get("run_id") or folder.name), str(record.get("run_name") or folder.name),
                   str(record.get("command") or "-"), params, metrics, steps,
                   "", str(folder), _STATUS.get(str(record.get("status")), str(record.get("status") or "")),
                   value, returned)


def machine_notes(runs: Sequence[RunData]) -> list[str]:
    """What differs between the machines and software the runs named by folder ran on (their ``versions.json``:
    packages and kind of CPU, ``cli.flat_versions``), and each resume of one on another machine
    (``resumes.jsonl``'s ``machine``): one line each. Such runs' numbers differ in their last digits even with the
    same seeds and settings, so a difference between them is not all the settings' (docs/inner_loop.md, "The same
    numbers on another CPU"). Runs named by MLflow id alone are not read."""
    from agent_trainer.cli import flat_versions

    records: dict[str, dict[str, Any]] = {}
    resumed: list[str] = []
    for r in runs:
        if r.folder is None:
            continue
        folder = Path(r.folder)
        try:
            records[r.name] = flat_versions(json.loads((folder / "versions.json").read_text()))
        except (OSError, ValueError):
            pass
        try:
            resumes = [json.loads(x) for x in (folder / "resumes.jsonl").read_text().splitlines() if x.strip()]
        except (OSError, ValueError):
            resumes = []
        for resume in resumes:
            moved = resume.get("machine") or {}
            if moved:
                what = "; ".join(f"{k} {v.get('saved')} -> {v.get('now')}" for k, v in moved.items())
                resumed.append(f"{r.name}: resumed after step {resume.get('steps_done', 0) - 1} on another machine "
                             f"or software ({what})")
    differs: list[str] = []
    for key in sorted({k for rec in records.values() for k in rec}):
        values: dict[str, list[str]] = {}
        for name, rec in records.items():
            if key in rec:
                values.setdefault(str(rec[key]), []).append(name)
        if len(values) > 1:
            differs.append(f"{key} differs: " + "; ".join(f"{v} in {', '.join(names)}" for v, names in values.items()))
    return differs + resumed
