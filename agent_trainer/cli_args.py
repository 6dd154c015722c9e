"""How ``at-*`` command lines become Hydra overrides, before Hydra starts (``agent_trainer.cli.main``).

``task=<file>.json``/``task=<name>``, ``model=<name>`` and a positional argument become overrides; ``rerun=<folder>``
(and Hydra's ``--experimental-rerun <folder>/.hydra/config.pickle``) the overrides a run was made with; a sweep
is reduced to the overrides composed up front. The rules: docs/architecture.md, "The command line of every at-*
command".
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Sequence

from omegaconf import OmegaConf

from agent_trainer import sweeps
from agent_trainer.config import CONFIG_DIR
from agent_trainer.paths import PROJECT_ROOT, resolve_path

TASKS_DIR = PROJECT_ROOT / "examples" / "tasks"
# Recipes named by a version until 2026-12-07: a saved run made under the old name resumes (or reruns) under the new
# one, which composes the same config; typed on a command line, the old name is one line naming the new one.
RENAMED_EXPERIMENTS = {"smollm2_cpu_v8": "smollm2_cpu", "smollm2_cpu_v7": "smollm2_cpu/no_kl"}
# Recipes removed then: their numbers are in docs/results/, their files at this commit.
REMOVED_EXPERIMENTS = ("smollm2_cpu_v3", "smollm2_cpu_v4", "smollm2_cpu_v5", "smollm2_cpu_v6")
REMOVED_EXPERIMENTS_COMMIT = "671c9cd0fa02cfc11d2c0165d4ee85ad9dd5bfab"
# Hydra flags followed by a value (so that value is not taken for a positional argument).
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                     "--config-dir", "-cd", "--experimental-rerun", "--shell-completion", "-sc"}


class UserError(Exception):
    """A mistake the user can fix; printed as one line, no traceback."""


def prog() -> str:
    """The command's name as typed (``at-eval``)."""
    return Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "agent-trainer"


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
        if key.lstrip("+~") == "experiment":
            _refuse_old_experiment(value)
        if key.lstrip("+~") == "task" and value:
            arg = _task_override(value, _include_path(argv))
        elif key == "model" and value and "," not in value and not (CONFIG_DIR / "model" / f"{value}.yaml").is_file():
            arg = f"model.name={value}"  # a model from base_models (configuration), not a configs/model option
        out.append(arg)
    return out


def _refuse_old_experiment(value: str) -> None:
    """An experiment named by a removed version (``experiment=smollm2_cpu_v8``): one line with the name to use."""
    for name in value.split(","):
        name = name.strip()
        if name in RENAMED_EXPERIMENTS:
            raise UserError(f"experiment={name} is now experiment={RENAMED_EXPERIMENTS[name]} (the same config); "
                            f"saved runs made under the old name resume as they are")
        if name in REMOVED_EXPERIMENTS:
            raise UserError(f"experiment={name} was removed; the current recipe is experiment=smollm2_cpu "
                            f"(its numbers: docs/results/); to run the old one: git checkout "
                            f"{REMOVED_EXPERIMENTS_COMMIT[:12]}")


def renamed_experiments(overrides: Sequence[str]) -> list[str]:
    """Saved overrides with a renamed experiment's new name (``RENAMED_EXPERIMENTS``), said once on stderr."""
    out = []
    for o in overrides:
        key, _, value = o.partition("=")
        if key.lstrip("+~") == "experiment" and value in RENAMED_EXPERIMENTS:
            print(f"{prog()}: the saved run's experiment={value} is now experiment={RENAMED_EXPERIMENTS[value]} "
                  f"(the same config)", file=sys.stderr)
            o = f"{key}={RENAMED_EXPERIMENTS[value]}"
        out.append(o)
    return out


def _include_path(argv: Sequence[str]) -> list[str]:
    """The folders of a ``task.include_path=[a,b]`` override on the command line (for a hint only)."""
    given = [a.partition("=")[2] for a in argv if a.lstrip("+").startswith("task.include_path=")]
    return [p.strip().strip("'\"") for p in given[-1].strip("[]").split(",") if p.strip()] if given else []


def _task_override(value: str, include_path: Sequence[str] = ()) -> str:
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
    specs = [k for k in known if k.startswith(f"{value}_v")]
    if specs:   # a built-in family's name: its specs are <family>_v<version>_<tier>
        raise UserError(f"{value!r} is a task family; a task is one of its specs: "
                        f"{' or '.join(f'task={k}' for k in specs)}")
    if any((resolve_path(folder) / f"{value}.yaml").is_file() for folder in include_path):
        raise UserError(f"{value!r} is a family card on task.include_path, not a task spec: at-train plays it by "
                        f"name (task.train_families=[{value}]); this command takes a spec: write {value}_v1_fast.json "
                        f"beside the card, like examples/families/word_math_v1_fast.json, and give task=<that file>")
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


def experimental_rerun(argv: Sequence[str]) -> list[str]:
    """Hydra's ``--experimental-rerun <folder>/.hydra/config.pickle`` -> ``rerun=<folder>``: a new run folder.

    Hydra's own replay would write into the old run's folder and MLflow run (and end 0 on a failure)."""
    argv = list(argv)
    if "--experimental-rerun" not in argv:
        return argv
    i = argv.index("--experimental-rerun")
    if i + 1 >= len(argv):
        raise UserError("--experimental-rerun takes a file: <run folder>/.hydra/config.pickle (or use rerun=<folder>)")
    path = resolve_path(argv[i + 1])
    if not path.exists():
        raise UserError(f"--experimental-rerun {argv[i + 1]}: no such file; give <run folder>/.hydra/config.pickle")
    folder = path.parent.parent if path.is_file() and path.parent.name == ".hydra" else path
    print(f"{prog()}: --experimental-rerun runs {folder} again into a new run folder (as rerun=<folder>)",
          file=sys.stderr)
    return [*argv[:i], f"rerun={folder}", *argv[i + 2:]]


def expand_resume(argv: Sequence[str]) -> list[str]:
    """``resume=<run folder>`` -> the overrides that run was made with (its runs_dir as the absolute folder it
    lies in), then the other arguments (later wins): ``at-train resume=runs/<id>`` continues the run as it was made,
    ``at-train resume=runs/<id> outer.steps=20`` makes it longer. ``resume=true`` / ``false`` are left as given; a
    folder without a run record is left for at-train to refuse."""
    given = [a for a in argv if a.startswith("resume=")]
    value = given[-1].partition("=")[2] if given else ""
    if value.lower() in ("", "true", "false") or "-m" in argv or "--multirun" in argv:
        return list(argv)
    if any(a.startswith("rerun=") for a in argv):
        raise UserError("rerun= starts a new run from a saved one, resume= continues one: give one of them")
    folder = resolve_path(value)
    saved = saved_overrides(folder) if folder.is_dir() else None
    if saved is None:
        return list(argv)
    resolved = folder / "config.resolved.yaml"
    run_id = str(OmegaConf.load(resolved).get("run_id", "")) if resolved.is_file() else ""
    parts, root = [p for p in run_id.split("/") if p], folder.resolve()
    # The folder is <runs_dir>/<run_id>: its runs_dir as an absolute path, from wherever this command runs.
    runs_dir = Path(*root.parts[:-len(parts)]) if parts and root.parts[-len(parts):] == tuple(parts) else None
    saved = _without(saved, ("run_id", "resume", "rerun", "hydra.run.dir") + (("runs_dir",) if runs_dir else ()))
    return saved + ([f"runs_dir={runs_dir}"] if runs_dir else []) + list(argv)


# What an at-train run's agent sampled its turns with: at-episode adapter=<one of its checkpoints> plays it so.
ADAPTER_AGENT_KEYS = ("model", "model_path", "temperature", "max_new_tokens", "max_turns", "tool_schemas",
                      "tool_format", "submit_at_turn_limit")


def expand_adapter(argv: Sequence[str]) -> list[str]:
    """``adapter=<a checkpoint of an at-train run>`` -> that run's agent settings (``ADAPTER_AGENT_KEYS``, from its
    ``config.resolved.yaml``), then the other arguments (later wins): the trained agent samples as it was trained
    (at-train's default samples at temperature 0.5, at-episode's agent group at 0.7). An adapter folder outside
    an at-train run is left as given."""
    given = [a.partition("=")[2] for a in argv if a.startswith("adapter=")]
    if not given or "," in given[-1]:   # a sweep over adapters: each keeps the command line's settings
        return list(argv)
    folder = resolve_path(given[-1])
    run = next((up for up in [folder, *folder.parents][:4] if (up / "config.resolved.yaml").is_file()), None)
    if run is None:
        return list(argv)
    conf = OmegaConf.load(run / "config.resolved.yaml")
    agent = conf.get("agent")
    if agent is None or conf.get("outer") is None:   # not an at-train run
        return list(argv)
    adopted = [f"agent.{k}={_override_value(agent[k])}" for k in ADAPTER_AGENT_KEYS if k in agent]
    print(f"{prog()}: the adapter's run {run} sampled with {', '.join(adopted)}; playing it so (set any of them "
          f"to change it)", file=sys.stderr)
    return adopted + list(argv)


def _override_value(value) -> str:
    """``value`` as a Hydra override writes it (null, true, 0.5, a plain word or path, else quoted)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if re.fullmatch(r"[A-Za-z0-9_./:~+-]+", text) and text.lower() not in ("null", "true", "false"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def saved_overrides(folder: Path) -> list[str] | None:
    """The overrides a run folder was made with, as typed: its ``run.json``'s (``.hydra/overrides.yaml`` for a
    folder without one), a renamed experiment under its new name; None when it has neither."""
    record = sweeps.read_run_file(folder)
    if record is not None and "overrides" in record:
        return renamed_experiments(record["overrides"])
    if (folder / ".hydra" / "overrides.yaml").is_file():
        return renamed_experiments([str(o) for o in OmegaConf.load(folder / ".hydra" / "overrides.yaml")])
    return None


def _without(overrides: Sequence[str], keys: Sequence[str]) -> list[str]:
    """``overrides`` less those that set one of ``keys`` (``+key=``, ``~key`` included)."""
    return [o for o in overrides if o.partition("=")[0].lstrip("+~") not in keys]


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
    saved = saved_overrides(folder)
    if saved is None:
        raise UserError(f"rerun={given[0].partition('=')[2]}: not a run folder (no {sweeps.RUN_FILE} or "
                        f".hydra/overrides.yaml in {folder})")
    os.environ[sweeps.RERUN_ENV] = str(folder)
    return _without(saved, ("run_id", "resume", "hydra.run.dir")) + [a for a in argv if not a.startswith("rerun=")]
