"""The one MLflow module: runs, nested runs, params from configs, batched metrics, artifacts.

    with Tracker.from_config(cfg, run_name="train") as tr:      # cfg: the composed Hydra config
        tr.log_config(cfg)                                      # flattened, secrets dropped
        tr.log_metrics({"reward/mean": 0.1, "loss": 1.0}, step=0)
        with tr.child("episode-0") as ep:                       # nested run (mlflow.parentRunId)
            ep.log_artifact("runs/x/episodes/0/trajectory.jsonl")

Its defaults (SQLite in the runs folder, ``MlflowClient``, a server probe) and why: docs/sweeps.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import time
import urllib.error
import urllib.request
from enum import Enum
from pathlib import Path
from typing import Any, Iterable, Mapping

from agent_trainer.config import TrackingConfig

MAX_PARAMS_PER_BATCH = 100  # MLflow's limit per log_batch call
MAX_METRICS_PER_BATCH = 1000
MAX_PARAM_VALUE = 6000  # MLflow rejects longer param values

_SECRET_WORDS = {"token", "password", "passwd", "pwd", "secret", "secrets", "credential", "credentials", "apikey"}
_SECRET_PAIRS = {("api", "key"), ("private", "key"), ("access", "key"), ("auth", "key")}
_SECRET_VALUE = re.compile(r"^(sk-|hf_|ghp_|gho_|github_pat_|xox[bap]-|AKIA)[A-Za-z0-9_\-]{12,}")


class TrackingError(RuntimeError):
    """MLflow cannot be used as configured; the message says what to change."""


def is_secret_key(key: str) -> bool:
    """True when the last part of a dotted key names a secret (``agent.api_key_env``, ``hf_token``)."""
    words = [w for w in re.split(r"[^a-z0-9]+", key.rsplit(".", 1)[-1].lower()) if w]
    return bool(_SECRET_WORDS.intersection(words)) or any(pair in _SECRET_PAIRS for pair in zip(words, words[1:]))


def looks_like_secret_value(value: Any) -> bool:
    """True for strings shaped like API keys or tokens."""
    return isinstance(value, str) and bool(_SECRET_VALUE.match(value.strip()))


def _plain(obj: Any) -> Any:
    """DictConfig / dataclass / Enum -> plain Python containers and scalars."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(obj, (DictConfig, ListConfig)):
            obj = OmegaConf.to_container(obj, resolve=True, throw_on_missing=False)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def flatten(cfg: Any, prefix: str = "", sep: str = ".") -> dict[str, Any]:
    """Nested config -> ``{"outer.lr": 1e-4, ...}``; lists of scalars stay one JSON value, lists of dicts are
    indexed."""
    out: dict[str, Any] = {}
    node = _plain(cfg)
    if isinstance(node, Mapping):
        for k, v in node.items():
            out.update(flatten(v, f"{prefix}{sep}{k}" if prefix else str(k), sep))
    elif isinstance(node, list) and any(isinstance(v, (Mapping, list)) for v in node):
        for i, v in enumerate(node):
            out.update(flatten(v, f"{prefix}{sep}{i}" if prefix else str(i), sep))
    else:
        out[prefix] = json.dumps(node) if isinstance(node, list) else node
    return out


def safe_params(params: Mapping[str, Any]) -> dict[str, str]:
    """Params as MLflow strings, without secrets, values truncated to MLflow's limit."""
    out = {}
    for key, value in params.items():
        if is_secret_key(key) or looks_like_secret_value(value):
            continue
        text = "None" if value is None else str(value)
        out[key] = text if len(text) <= MAX_PARAM_VALUE else text[: MAX_PARAM_VALUE - 3] + "..."
    return out


# at-train's step metrics grouped for the MLflow UI: ``reward/reward_mean``, ``time/seconds_step``...
# (metrics.jsonl keeps the bare names; ``bare_key`` undoes the prefix).
METRIC_GROUPS = ("reward", "stage", "choice", "cost", "update", "time", "heldout", "eval")
_GROUP_OF = (("heldout_", "heldout"), ("paired_", "eval"), ("train_eval_", "eval"), ("reward_", "reward"),
             ("uplift_", "reward"), ("share_", "choice"),
             ("update_", "update"), ("seconds_", "time"), ("usd", "cost"), ("tokens", "cost"), ("cache_", "cost"))


_NOT_IN_NAMES = re.compile(r"[^A-Za-z0-9_\-. :/]")


def metric_name(key: str) -> str:
    """``key`` with the characters MLflow refuses in a metric name replaced by ``_`` (a refused name would end
    the run that logs it)."""
    return _NOT_IN_NAMES.sub("_", str(key))[:250]


def metric_key(name: str) -> str:
    """The grouped MLflow key of an at-train step metric (``share_peft_lora`` -> ``choice/share_peft_lora``)."""
    if "/" in name:
        return name
    group = next((g for prefix, g in _GROUP_OF if name.startswith(prefix)), "stage")
    return f"{group}/{name}"


def bare_key(key: str) -> str:
    """``reward/reward_mean`` -> ``reward_mean``; keys outside the groups are returned as they are."""
    group, sep, name = key.partition("/")
    return name if sep and group in METRIC_GROUPS else key


def check_tracking_uri(uri: str, timeout_s: float = TrackingConfig.connect_timeout_s) -> None:
    """Fail fast with a clear message when ``uri`` cannot work (server down, missing folder, file store)."""
    if uri.startswith(("http://", "https://")):
        try:
            urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s).close()
        except urllib.error.HTTPError:
            return  # something answered; MLflow will say more if it is not an MLflow server
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise TrackingError(
                f"MLflow server {uri} did not answer within {timeout_s:g}s ({reason}); start it "
                f"(mlflow server --backend-store-uri sqlite:///mlflow.db --port 5000) or drop tracking=server "
                f"to log to the local SQLite file"
            ) from None
    elif uri.startswith("sqlite:///"):
        prepare_sqlite(Path(uri[len("sqlite:///"):]))
    elif uri.startswith("file:") or "://" not in uri:
        raise TrackingError(
            f"tracking_uri {uri!r} is MLflow's file store, which MLflow 3.17 refuses by default; "
            f"use sqlite:///<absolute path>/mlflow.db or an http(s):// server"
        )


def check_reachable(cfg: Any) -> None:
    """Probe the configured MLflow server (``tracking=server``) before a command starts any work.

    Commands call this right after writing the run folder, so a wrong or closed URI ends the
    command in seconds with one line, not after imports, model loads or an hour of training.
    """
    t = cfg.tracking
    if bool(t.enabled) and str(t.tracking_uri).startswith(("http://", "https://")):
        check_tracking_uri(str(t.tracking_uri), float(t.connect_timeout_s))


def prepare_sqlite(path: Path) -> None:
    """Make the folder and, for a new file, copy an empty MLflow database from the cache.

    MLflow builds a new SQLite database by running all its schema migrations (~9 s here); every
    fresh runs folder (each test's tmp_path) would pay that. The empty database of one MLflow
    version is the same everywhere, so it is built once per version in the cache and copied.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        return
    import mlflow
    from mlflow import MlflowClient

    from agent_trainer.paths import cache_dir

    template = cache_dir() / "mlflow" / f"empty-{mlflow.__version__}.db"
    if not template.exists():
        build = template.parent / f"build-{os.getpid()}"
        build.mkdir(parents=True, exist_ok=True)
        MlflowClient(tracking_uri=f"sqlite:///{build / 'mlflow.db'}").search_experiments()  # runs the migrations
        os.replace(build / "mlflow.db", template)  # atomic: concurrent builders just overwrite each other
        shutil.rmtree(build, ignore_errors=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    shutil.copyfile(template, tmp)
    # The template's Default experiment points at the folder it was built in; point it next to this file.
    import sqlite3

    with contextlib.closing(sqlite3.connect(tmp)) as db, db:
        db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                   ((path.parent / "mlartifacts" / "0").resolve().as_uri(),))
    if not path.exists():
        os.replace(tmp, path)
    else:
        tmp.unlink()


class Tracker:
    """One MLflow run (context manager). Disabled trackers accept every call and log nothing."""

    def __init__(
        self,
        tracking_uri: str,
        experiment: str = TrackingConfig.experiment,
        run_name: str | None = None,
        artifact_location: str | None = None,
        tags: Mapping[str, Any] | None = None,
        connect_timeout_s: float = TrackingConfig.connect_timeout_s,
        enabled: bool = TrackingConfig.enabled,
        parent: "Tracker | None" = None,
    ):
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self.artifact_location, self.connect_timeout_s = artifact_location, connect_timeout_s
        self.enabled, self.parent = enabled, parent
        self._tags = dict(tags or {})
        self.client = parent.client if parent is not None else None
        self.experiment_id: str | None = parent.experiment_id if parent is not None else None
        self.run_id: str | None = None
        self.attached = False   # continues an existing run (attach): never deleted by this process

    @classmethod
    def from_config(cls, cfg: Any, run_name: str | None = None, tags: Mapping[str, Any] | None = None) -> "Tracker":
        """A tracker from the ``tracking`` node of a composed config (``enabled: false`` -> logs nothing)."""
        t = cfg.tracking
        return cls(
            tracking_uri=str(t.tracking_uri), experiment=str(t.experiment), run_name=run_name,
            artifact_location=None if t.artifact_location is None else str(t.artifact_location),
            tags=tags, connect_timeout_s=float(t.connect_timeout_s), enabled=bool(t.enabled),
        )

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> "Tracker":
        """Create the run (and the experiment and client when this is not a child run)."""
        if not self.enabled or self.run_id is not None:
            return self
        if self.client is None:
            from mlflow import MlflowClient

            check_tracking_uri(self.tracking_uri, self.connect_timeout_s)
            self.client = MlflowClient(tracking_uri=self.tracking_uri)
            self.experiment_id = self._experiment_id()
        tags = {k: str(v) for k, v in self._tags.items()}
        if self.parent is not None:
            tags["mlflow.parentRunId"] = self.parent.run_id
        run = self.client.create_run(self.experiment_id, run_name=self.run_name, tags=tags)
        self.run_id = run.info.run_id
        return self

    def attach(self, run_id: str, reopen: bool = True) -> "Tracker":
        """Continue an existing run (a resumed training) instead of creating a new one; ``reopen=False`` only adds
        to it (an evaluation of a finished run), its status and tags left as they are."""
        if not self.enabled:
            return self
        from mlflow import MlflowClient

        check_tracking_uri(self.tracking_uri, self.connect_timeout_s)
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        run = self.client.get_run(run_id)
        self.run_id, self.experiment_id = run_id, run.info.experiment_id
        self.run_name, self.attached = run.info.run_name, True
        if not reopen:
            return self
        self.client.update_run(run_id, status="RUNNING")
        if "error" in run.data.tags:   # the kill (or failure) it is resumed from is over: its outcome decides
            self.client.delete_tag(run_id, "error")
        return self

    def delete(self) -> None:
        """Delete the run (a run that a user error ended at start-up: nothing in it to keep or compare)."""
        if self.enabled and self.run_id is not None:
            self.client.delete_run(self.run_id)

    def _experiment_id(self) -> str:
        exp = self.client.get_experiment_by_name(self.experiment)
        if exp is not None:
            return exp.experiment_id
        location = None
        if self.artifact_location:
            Path(self.artifact_location).expanduser().mkdir(parents=True, exist_ok=True)
            location = Path(self.artifact_location).expanduser().resolve().as_uri()
        try:
            return self.client.create_experiment(self.experiment, artifact_location=location)
        except Exception:  # another process created it between our lookup and create
            exp = self.client.get_experiment_by_name(self.experiment)
            if exp is None:
                raise
            return exp.experiment_id

    def end(self, status: str = "FINISHED") -> None:
        """Close the run with ``FINISHED``, ``FAILED`` or ``KILLED``."""
        if self.enabled and self.run_id is not None:
            self.client.set_terminated(self.run_id, status=status)

    def __enter__(self) -> "Tracker":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        status = "FINISHED" if exc_type is None else "KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED"
        self.end(status)

    def child(self, run_name: str, tags: Mapping[str, Any] | None = None) -> "Tracker":
        """A nested run under this one; use it as a context manager."""
        if self.enabled and self.run_id is None:
            raise TrackingError("start the parent run before creating a child run (use `with tracker:`)")
        return Tracker(self.tracking_uri, self.experiment, run_name, self.artifact_location, tags,
                       self.connect_timeout_s, self.enabled, parent=self)

    def child_names(self) -> set[str]:
        """Run names of this run's nested runs (to log each child exactly once across a resume)."""
        if not self.enabled or self.run_id is None:
            return set()
        runs = self.client.search_runs([self.experiment_id], f"tags.mlflow.parentRunId = '{self.run_id}'",
                                       max_results=50_000)
        return {r.info.run_name for r in runs}

    # --- logging --------------------------------------------------------------------------
    def _require_run(self) -> bool:
        if not self.enabled:
            return False
        if self.run_id is None:
            raise TrackingError("the MLflow run is not started; use `with Tracker(...) as tr:` or call start()")
        return True

    def log_params(self, params: Mapping[str, Any]) -> dict[str, str]:
        """Log params (secrets dropped, values stringified); returns what was logged."""
        clean = safe_params(params)
        if self._require_run():
            from mlflow.entities import Param  # not imported with tracking off: ~3 s of a cold start

            items = [Param(k, v) for k, v in clean.items()]
            for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
                self.client.log_batch(self.run_id, params=items[i : i + MAX_PARAMS_PER_BATCH])
        return clean

    def log_config(self, cfg: Any) -> dict[str, str]:
        """Log a resolved config flattened to dotted keys (``outer.lr``)."""
        return self.log_params(flatten(cfg))

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Log many metrics in one batched call; ``None`` values are skipped."""
        from mlflow.entities import Metric

        if not self._require_run():
            return
        now = int(time.time() * 1000)
        items = []
        for key, value in metrics.items():
            if value is None:
                continue
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise TrackingError(f"metric {key!r} must be a number, got {value!r}") from None
            items.append(Metric(metric_name(key), number, now, int(step or 0)))
        for i in range(0, len(items), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=items[i : i + MAX_METRICS_PER_BATCH])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set run tags (secret-looking keys or values are dropped)."""
        from mlflow.entities import RunTag

        if self._require_run():
            items = [RunTag(k, v) for k, v in safe_params(tags).items()]
            for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
                self.client.log_batch(self.run_id, tags=items[i : i + MAX_PARAMS_PER_BATCH])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Copy one file into the run's artifacts."""
        if self._require_run():
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_artifacts(self, folder: str | Path, artifact_path: str | None = None) -> None:
        """Copy a folder's files into the run's artifacts."""
        if self._require_run():
            self.client.log_artifacts(self.run_id, str(folder), artifact_path)


def read_metrics(tracking_uri: str, run_id: str,
                 keys: Iterable[str] | None = None) -> dict[str, list[tuple[int, float]]]:
    """``{key: [(step, value), ...]}`` of a run, read back from MLflow (for tests and reports)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    names = list(keys) if keys is not None else list(client.get_run(run_id).data.metrics)
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in names}
