"""Validation probe: everything that can be wrong with a job, found before it runs, as findings.

    >>> from evaluation.tasks import load_task
    >>> from inner_loop.validate import validate_job
    >>> report = validate_job("examples/jobs/sft_full", load_task("examples/tasks/calc_chain_v1_fast.json"))
    >>> report.ok, report.to_text()        # the text is what the agent reads back

``validate_job`` never raises on bad input: a missing folder, bad YAML, a schema error, a bad data
or reward file, a job over the task's budget all become ``Finding``s (field, message, hint,
severity). Errors make the job invalid; warnings are advice. Checks, in order: the YAML, the
schema (``inner_loop.jobspec``), the task (allowed base model, step budget), the files (data rows,
reward file syntax and names, read with ``ast`` and never executed here), the estimated cost
(``inner_loop.cost``), then the dry run (``dry_run=True``, ``inner_loop.probe``): load the base
model, tokenize the first rows, compute the first SFT loss or sample GRPO completions and score
them with the job's rewards in a child process.
"""

from __future__ import annotations

import ast
import traceback
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from evaluation.families import FAMILIES, FamilyError
from evaluation.tasks import TaskSpec, TaskSpecError, load_task
from inner_loop.cost import KNOWN_BASE_MODELS, CostEstimate, CostModel, estimate_cost
from inner_loop.data import DataFileError, build_rows
from inner_loop.jobspec import GRPO_ONLY, JOB_FILE, JobSpec, error_field, read_job_yaml

Severity = Literal["error", "warning"]


@dataclass
class Finding:
    """One problem: which field, what is wrong, what to do about it."""

    field: str
    message: str
    hint: str = ""
    severity: Severity = "error"


@dataclass
class ValidationReport:
    """The probe's answer: findings, the cost estimate and what the dry run saw."""

    job_dir: str
    findings: list[Finding] = field(default_factory=list)
    estimated_cost: CostEstimate | None = None
    probe: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when no finding is an error (warnings do not block a job)."""
        return not self.errors

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    def add(self, field_: str, message: str, hint: str = "", severity: Severity = "error") -> None:
        self.findings.append(Finding(field_, message, hint, severity))

    def to_dict(self) -> dict:
        """JSON-ready form (for tool results and result files)."""
        return {"ok": self.ok, "job_dir": self.job_dir, "findings": [asdict(f) for f in self.findings],
                "estimated_cost": asdict(self.estimated_cost) if self.estimated_cost else None,
                "probe": self.probe}

    def to_text(self) -> str:
        """What the agent reads: verdict, one block per finding, cost, dry-run samples."""
        head = "VALID" if self.ok else "INVALID"
        lines = [f"job {self.job_dir}: {head} ({len(self.errors)} errors, {len(self.warnings)} warnings)"]
        for f in sorted(self.findings, key=lambda f: f.severity != "error"):
            lines.append(f"{f.severity:<7} {f.field}: {f.message}")
            if f.hint:
                lines.append(f"        fix: {f.hint}")
        if self.estimated_cost:
            lines.append("estimated cost: " + self.estimated_cost.summary())
        if "initial_loss" in self.probe:
            lines.append(f"dry run: first SFT batch loss {self.probe['initial_loss']:.3f}")
        for s in self.probe.get("samples", [])[:6]:
            lines.append(f"dry run: {s['prompt']!r} -> {s['completion']!r} reward {s['total']}")
        return "\n".join(lines)


# --- schema errors as findings ---------------------------------------------------------------


def _model_in(annotation) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as ``PeftSpec | None`` or ``list[DataSource]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found:
            return found
    return None


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The schema model that holds the last key of ``loc`` (None when the path leaves the schema)."""
    model: type[BaseModel] | None = JobSpec
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part) if model else None
        model = _model_in(info.annotation) if info else None
    return model


def _allowed_keys(loc: tuple) -> list[str]:
    model = _model_at(loc)
    return list(model.model_fields) if model else []


def _range_hint(loc: tuple) -> str:
    """'allowed: 0 <= seed < 1000000' from the field's declared bounds."""
    model = _model_at(loc)
    info = model.model_fields.get(loc[-1]) if model and loc else None
    if info is None:
        return "pick a value inside the range in the message"
    low = high = ""
    for m in info.metadata:
        for attr, sign in (("ge", "<="), ("gt", "<")):
            if getattr(m, attr, None) is not None:
                low = f"{getattr(m, attr)} {sign} "
        for attr, sign in (("le", "<="), ("lt", "<")):
            if getattr(m, attr, None) is not None:
                high = f" {sign} {getattr(m, attr)}"
    desc = f" ({info.description})" if info.description else ""
    return f"allowed: {low}{loc[-1]}{high}{desc}"


def _hint(err: dict) -> str:
    kind, loc = err["type"], err["loc"]
    if kind == "extra_forbidden":
        return f"remove {loc[-1]!r} (a typo?); allowed keys here: {', '.join(_allowed_keys(loc))}"
    if kind == "missing":
        return f"add {loc[-1]}: to {'.'.join(map(str, loc[:-1])) or 'the top level of job.yaml'}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return "write a whole number, e.g. 64"
    if kind in ("float_parsing", "float_type"):
        return "write a number, e.g. 5.0e-4"
    if kind == "finite_number":
        return "write a finite number"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return _range_hint(loc)
    if kind == "literal_error":
        return "use one of the values listed in the message"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return "write a mapping here (key: value lines or {key: value})"
    if kind == "list_type":
        return "write a list here, e.g. [{...}, {...}]"
    if kind == "too_short":
        return "add at least one item"
    if kind == "string_pattern_mismatch":
        return "use a Python identifier: letters, digits and _, not starting with a digit"
    if kind == "string_type":
        return "write text here (quote it if YAML reads it as something else)"
    return ""


def _schema_findings(report: ValidationReport, e: ValidationError) -> None:
    for err in e.errors():
        where, msg = error_field(err)
        if err["type"] == "value_error":
            # Our validators write "problem; fix".
            msg, _, hint = msg.partition("; ")
            report.add(where, msg, hint or "see the field's description in the job schema")
            continue
        shown = err.get("input")
        if err["type"] != "missing" and not isinstance(shown, (dict, list)):
            msg = f"{msg} (got {shown!r})"
        report.add(where, msg, _hint(err))


# --- checks that need the task and the files -------------------------------------------------


def _check_task(report: ValidationReport, spec: JobSpec, task: TaskSpec) -> None:
    if spec.base_model not in KNOWN_BASE_MODELS:
        report.add("base_model", f"unknown base model {spec.base_model!r}",
                   f"use one of the task's allowed models: {', '.join(task.allowed_base_models)}")
    elif spec.base_model not in task.allowed_base_models:
        report.add("base_model", f"base model {spec.base_model!r} is not allowed for task {task.name}",
                   f"use one of: {', '.join(task.allowed_base_models)}")
    hp = spec.hyperparameters
    if hp.max_steps > task.budget.max_steps:
        report.add("hyperparameters.max_steps", f"max_steps {hp.max_steps} is over the task budget of "
                   f"{task.budget.max_steps} steps", f"set max_steps: {task.budget.max_steps} or less")
    for i, src in enumerate(spec.data.sources):
        if src.family != task.family:
            report.add(f"data.sources.{i}.family", f"source family {src.family!r} is not the task's family "
                       f"{task.family!r}; the hidden evaluation scores {task.family} only",
                       f"add a {task.family} source unless the mix is deliberate", "warning")
    set_fields = hp.model_fields_set
    if spec.algorithm == "sft":
        if spec.reward is not None:
            report.add("reward", "sft does not use a reward; it will be ignored",
                       "remove reward, or use algorithm: grpo", "warning")
        ignored = [k for k in GRPO_ONLY if k in set_fields]
        if ignored:
            report.add("hyperparameters", f"{', '.join(ignored)} only apply to grpo and are ignored by sft",
                       "remove them", "warning")
    if "epochs" in set_fields and "max_steps" in set_fields:
        report.add("hyperparameters.epochs", "epochs is ignored when max_steps is given",
                   "keep one of them", "warning")
    if hp.warmup_ratio > 0 and hp.lr_scheduler == "constant":
        report.add("hyperparameters.warmup_ratio", "the constant scheduler has no warmup",
                   "use lr_scheduler: constant_with_warmup or cosine", "warning")
    if spec.algorithm == "grpo" and spec.peft is None and hp.learning_rate >= 1e-3:
        report.add("hyperparameters.learning_rate", f"GRPO with full fine-tuning at lr {hp.learning_rate:g} "
                   "went flat or down on these models", "try 5.0e-4 (LoRA tolerates about 2.0e-3)", "warning")
    if spec.reward and spec.algorithm == "grpo" and FAMILIES[task.family].scorer == "numeric":
        names = {f.name for f in spec.reward.functions}
        if names == {"exact_match"}:
            report.add("reward.functions", "exact_match alone is too sparse for GRPO on a weak base "
                       "(most groups get no reward spread)", "add {name: numeric_closeness, weight: 1.0}", "warning")


def _defined_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _check_reward_file(report: ValidationReport, spec: JobSpec, job_dir: Path) -> bool:
    """Parse (never run) the reward file; True when every ``source: file`` function is defined in it."""
    wanted = [f.name for f in spec.reward.functions if f.source == "file"] if spec.reward else []
    if not wanted:
        return True
    path = job_dir / spec.reward.file
    if not path.is_file():
        report.add("reward.file", f"reward file {spec.reward.file!r} not found in the job folder",
                   f"write {spec.reward.file} defining {', '.join(wanted)}, or use library rewards")
        return False
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=spec.reward.file)
    except (SyntaxError, ValueError, UnicodeDecodeError) as e:
        line = f" line {e.lineno}" if getattr(e, "lineno", None) else ""
        report.add("reward.file", f"{spec.reward.file}{line}: {getattr(e, 'msg', None) or e}",
                   "fix the Python syntax; the file must import cleanly")
        return False
    missing = [n for n in wanted if n not in _defined_names(tree)]
    for i, f in enumerate(spec.reward.functions):
        if f.name in missing:
            report.add(f"reward.functions.{i}.name", f"{spec.reward.file} defines no function {f.name!r}",
                       f"define def {f.name}(prompts, completions, **kwargs) -> list[float] at the top level")
    return not missing


def _check_data(report: ValidationReport, spec: JobSpec, job_dir: Path, task: TaskSpec) -> list[dict] | None:
    try:
        rows = build_rows(spec, job_dir, default_family=task.family)
    except DataFileError as e:
        for line, msg in e.problems[:5]:
            report.add("data.file", f"{e.path.name} line {line}: {msg}" if line else f"{e.path.name}: {msg}",
                       "each line must be a JSON object with string prompt and answer")
        if len(e.problems) > 5:
            report.add("data.file", f"{len(e.problems) - 5} more bad lines in {e.path.name}", "fix them all")
        return None
    except FamilyError as e:
        report.add("data.sources", str(e), "fix the source's family, seed or size")
        return None
    per_step = spec.rows_per_step()
    if len(rows) < per_step:
        report.add("data", f"{len(rows)} rows is fewer than the {per_step} rows one step uses",
                   "add rows or lower batch_size", "warning")
    passes = spec.effective_max_steps(len(rows)) * per_step / len(rows)
    if passes > 50:
        report.add("data", f"training repeats each row about {passes:.0f} times ({len(rows)} rows)",
                   "use more rows (a larger size) to avoid memorising", "warning")
    return rows


# --- the probe ---------------------------------------------------------------------------------


def _resolve_task(task: TaskSpec | str | Path, report: ValidationReport) -> TaskSpec | None:
    if isinstance(task, TaskSpec):
        return task
    try:
        return load_task(task)
    except TaskSpecError as e:
        report.add("task", str(e), "pass a valid task spec (examples/tasks/*.json)")
        return None


def _load_spec(report: ValidationReport, job_dir: Path) -> JobSpec | None:
    if not job_dir.is_dir():
        what = "is a file, not a folder" if job_dir.exists() else "does not exist"
        report.add("job_dir", f"job folder {str(job_dir)!r} {what}", "create the folder and write job.yaml in it")
        return None
    path = job_dir / JOB_FILE
    if not path.is_file():
        report.add(JOB_FILE, f"{JOB_FILE} not found in {job_dir}", "write job.yaml (see examples/jobs/)")
        return None
    try:
        raw = read_job_yaml(path)
    except ValueError as e:  # yaml.YAMLError, duplicate keys, non-UTF-8: all explained in the message
        report.add(JOB_FILE, str(e), "fix the YAML: indentation, colons, matching brackets and quotes")
        return None
    if not isinstance(raw, dict):
        kind = {"int": "a number", "float": "a number", "str": "a single string", "list": "a list"}.get(
            type(raw).__name__, type(raw).__name__)
        what = "empty" if raw is None else f"{kind}, not a mapping"
        report.add("<root>", f"{JOB_FILE} is {what}",
                   "write top-level keys: base_model, algorithm, hyperparameters, data, reward, seed")
        return None
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as e:
        _schema_findings(report, e)
        return None


def validate_job(job_dir: str | Path, task: TaskSpec | str | Path, *, dry_run: bool = True,
                 cache_dir: str | Path | None = None, cost_model: CostModel | None = None,
                 model_dir: str | Path | None = None, reward_timeout_s: float = 30.0) -> ValidationReport:
    """Validate a job folder for a task; never raises on bad input (every problem is a finding).

    ``dry_run`` loads the base model (``inner_loop.models``, cached under ``cache_dir``) and probes
    the first rows; ``model_dir`` uses that model folder instead of resolving ``base_model``.
    ``cost_model`` prices the job (default ``CostModel()``: this CPU, $0.10 per hour).
    """
    job_dir = Path(job_dir)
    report = ValidationReport(job_dir=str(job_dir))
    cost_model = cost_model or CostModel()
    try:
        spec_task = _resolve_task(task, report)
        spec = _load_spec(report, job_dir)
        if spec is None or spec_task is None:
            return report
        _check_task(report, spec, spec_task)
        reward_ok = _check_reward_file(report, spec, job_dir)
        rows = _check_data(report, spec, job_dir, spec_task)
        n_rows = len(rows) if rows else spec.rows_per_step()
        report.estimated_cost = estimate_cost(spec, cost_model, steps=spec.effective_max_steps(n_rows))
        _check_budget(report, spec_task, report.estimated_cost)
        if dry_run and rows and reward_ok and not report.errors:
            from inner_loop.probe import dry_run as run_probe

            run_probe(report, spec, job_dir, rows, cache_dir=cache_dir, model_dir=model_dir,
                      reward_timeout_s=reward_timeout_s)
    except Exception as e:  # a bug in the probe must reach the agent as a finding, not crash the harness
        report.add("<internal>", f"validation failed unexpectedly: {type(e).__name__}: {e}",
                   "report this to the harness maintainers; the job itself may be fine")
        report.probe["internal_traceback"] = traceback.format_exc()[-2000:]
    return report


def _check_budget(report: ValidationReport, task: TaskSpec, cost: CostEstimate) -> None:
    if any(f.field == "base_model" for f in report.errors):
        return  # the estimate is for a model the job cannot use; the base_model error says enough
    budget = task.budget
    if cost.seconds > budget.max_seconds:
        fits = cost.steps_within(budget.max_seconds)
        hint = (f"lower max_steps to about {fits}, or lower batch_size or num_generations" if fits >= 10 else
                "not even 10 steps fit: lower batch_size, num_generations or max_completion_length, "
                "or use a smaller base model")
        report.add("hyperparameters.max_steps", f"estimated {cost.seconds:.0f} s is over the task's "
                   f"{budget.max_seconds:.0f} s budget", hint)
    elif cost.seconds > 0.8 * budget.max_seconds:
        report.add("hyperparameters.max_steps", f"estimated {cost.seconds:.0f} s is close to the "
                   f"{budget.max_seconds:.0f} s budget; a slow machine may time out", "leave some margin", "warning")
    if cost.usd > budget.max_usd:
        report.add("hyperparameters.max_steps", f"estimated ${cost.usd:.4f} is over the task's ${budget.max_usd} "
                   "budget", "train fewer steps or use a smaller base model")
