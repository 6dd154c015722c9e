"""Validation probe: everything that can be wrong with a job, found before it runs, as findings.

    report = validate_job("examples/jobs/sft_full", load_task("examples/tasks/calc_chain_v1_fast.json"))
    report.ok, report.to_text()        # the text is what the agent reads back

Never raises on bad input: every problem is a ``Finding`` (field, message, hint, severity).
The checks, in order: docs/inner_loop.md, "Validation".
"""

from __future__ import annotations

import ast
import traceback
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from agent_trainer.evaluation.families import FAMILIES, FamilyError
from agent_trainer.evaluation.prompts import for_task
from agent_trainer.evaluation.tasks import TaskSpec, TaskSpecError, load_task
from agent_trainer.inner_loop.spec.cost import CostEstimate, CostModel, estimate_job, row_tokens
from agent_trainer.inner_loop.train.data import DataFileError, build_rows_with_origins
from agent_trainer.inner_loop.spec.jobspec import (
    DPO_IGNORED, GRPO_ONLY, JOB_FILE, MAX_JOB_ROWS, JobSpec, error_field, parse_job, read_job_yaml,
)
from agent_trainer.inner_loop.spec.jobfiles import (
    MAX_REWARD_FILE_BYTES, job_file_problems, job_folder_problems, oversized,
)
from agent_trainer.inner_loop.isolation.sandbox import SandboxPolicy
from agent_trainer.inner_loop.spec.reward_checks import answer_table_problem

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
    estimated_cost: CostEstimate | None = None   # compute (agent_trainer.inner_loop.spec.cost): what the budget counts
    wall_estimate: CostEstimate | None = None    # the seconds expected on this machine: the safety cap's base
    probe: dict = field(default_factory=dict)
    # The estimate is over the task's USD cap; with no other error the job is ``over_budget``, not ``invalid``.
    over_usd: bool = False

    @property
    def ok(self) -> bool:
        """True when no finding is an error (warnings do not block a job)."""
        return not self.errors

    @property
    def over_budget(self) -> bool:
        """True when the USD estimate is over the cap and every error is a budget error."""
        return self.over_usd and all(f.field in ("stages", "hyperparameters.max_steps") for f in self.errors)

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
    if kind == "too_long":
        return "remove items down to the limit in the message"
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


def _stage_views(spec: JobSpec) -> list[tuple[JobSpec, str, str, str]]:
    """``(single-stage view, prefix of its own fields, of its data, of its reward)`` per stage."""
    if spec.stages is None:
        return [(spec, "", "data", "reward")]
    return [(view, f"stages.{i}.", f"stages.{i}.data" if st.data else "data",
             f"stages.{i}.reward" if st.reward else "reward")
            for i, (view, st) in enumerate(zip(spec.stage_specs(), spec.stages))]


def _check_task(report: ValidationReport, spec: JobSpec, task: TaskSpec) -> None:
    from agent_trainer.inner_loop.models.registry import BASE_MODELS

    if spec.base_model not in BASE_MODELS:
        report.add("base_model", f"unknown base model {spec.base_model!r}",
                   f"use one of the task's allowed models: {', '.join(task.allowed_base_models)}")
    elif spec.base_model not in task.allowed_base_models:
        report.add("base_model", f"base model {spec.base_model!r} is not allowed for task {task.name}",
                   f"use one of: {', '.join(task.allowed_base_models)}")
    if spec.stages is not None:
        total = sum(st.hyperparameters.max_steps for st in spec.stages)
        if total > task.budget.max_steps:
            report.add("stages", f"the stages' max_steps add up to {total}, over the task budget of "
                       f"{task.budget.max_steps} steps (the stages share it)",
                       f"lower them so that they add up to {task.budget.max_steps} or less")
    for view, at, data_at, reward_at in _stage_views(spec):
        own_reward = spec.stages is None or spec.stages[int(at.split(".")[1])].reward is not None
        _check_stage_task(report, view, task, at, data_at, reward_at, own_reward)


def _check_stage_task(report: ValidationReport, spec: JobSpec, task: TaskSpec, at: str, data_at: str,
                      reward_at: str, own_reward: bool) -> None:
    """The task checks of one stage (``spec``: its single-stage view); field names carry its prefixes."""
    hp = spec.hyperparameters
    if not at and hp.max_steps > task.budget.max_steps:
        report.add("hyperparameters.max_steps", f"max_steps {hp.max_steps} is over the task budget of "
                   f"{task.budget.max_steps} steps", f"set max_steps: {task.budget.max_steps} or less")
    for i, src in enumerate(spec.data.sources):
        if src.family != task.family:
            report.add(f"{data_at}.sources.{i}.family", f"source family {src.family!r} is not the task's family "
                       f"{task.family!r}; the hidden evaluation scores {task.family} only",
                       f"add a {task.family} source unless the mix is deliberate", "warning")
    set_fields = hp.model_fields_set
    selfgen = any(src.self_generated is not None for src in spec.data.sources)
    if spec.algorithm == "sft":
        if spec.reward is not None and own_reward and not selfgen:
            report.add(reward_at, "sft does not use a reward; it will be ignored",
                       "remove reward, or use algorithm: grpo (sft uses it only to accept self_generated samples)",
                       "warning")
        ignored = [k for k in GRPO_ONLY if k in set_fields]
        if ignored:
            report.add(f"{at}hyperparameters", f"{', '.join(ignored)} only apply to grpo and are ignored by sft",
                       "remove them", "warning")
    if spec.algorithm == "dpo":
        ignored = [k for k in DPO_IGNORED if k in set_fields]
        if ignored:
            report.add(f"{at}hyperparameters", f"{', '.join(ignored)} only apply to grpo and are ignored by dpo",
                       "remove them", "warning")
    if "epochs" in set_fields and "max_steps" in set_fields:
        report.add(f"{at}hyperparameters.epochs", "epochs is ignored when max_steps is given",
                   "keep one of them", "warning")
    if hp.warmup_ratio > 0 and hp.lr_scheduler == "constant":
        report.add(f"{at}hyperparameters.warmup_ratio", "the constant scheduler has no warmup",
                   "use lr_scheduler: constant_with_warmup or cosine", "warning")
    if spec.algorithm == "grpo" and spec.peft is None and hp.learning_rate >= 1e-3:
        report.add(f"{at}hyperparameters.learning_rate", f"GRPO with full fine-tuning at lr {hp.learning_rate:g} "
                   "went flat or down on these models", "try 5.0e-4 (LoRA tolerates about 2.0e-3)", "warning")
    if spec.algorithm == "dpo" and hp.learning_rate >= (1e-2 if spec.peft else 1e-3):
        report.add(f"{at}hyperparameters.learning_rate", f"DPO {'with LoRA ' if spec.peft else ''}at lr "
                   f"{hp.learning_rate:g} pushed these models down (docs/inner_loop.md)",
                   "try 5.0e-4 with beta 0.5 (full) or 5.0e-3 (LoRA)", "warning")
    if spec.reward and spec.algorithm in ("grpo", "dpo") and FAMILIES[task.family].scorer == "numeric":
        names = {f.name for f in spec.reward.functions}
        if names == {"exact_match"}:
            what = "most groups get no reward spread" if spec.algorithm == "grpo" else "few prompts give a pair"
            report.add(f"{reward_at}.functions", f"exact_match alone is too sparse for {spec.algorithm.upper()} on "
                       f"a weak base ({what})", "add {name: numeric_closeness, weight: 1.0}", "warning")


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


def _check_reward_files(report: ValidationReport, spec: JobSpec, job_dir: Path) -> bool:
    """Every reward section of the job (the top level's, each stage's own); True when all are fine."""
    sections = [(spec.reward, "reward")]
    sections += [(st.reward, f"stages.{i}.reward") for i, st in enumerate(spec.stages or []) if st.reward]
    return all([_check_reward_file(report, reward, job_dir, at) for reward, at in sections])


def _check_reward_file(report: ValidationReport, reward, job_dir: Path, at: str = "reward") -> bool:
    """Parse (never run) the reward file; True when every ``source: file`` function is defined in it."""
    wanted = [f.name for f in reward.functions if f.source == "file"] if reward else []
    if not wanted:
        return True
    path = job_dir / reward.file
    if not path.is_file():
        report.add(f"{at}.file", f"reward file {reward.file!r} not found in the job folder",
                   f"write {reward.file} defining {', '.join(wanted)}, or use library rewards")
        return False
    too_big = oversized(path, MAX_REWARD_FILE_BYTES)
    if too_big:
        report.add(f"{at}.file", too_big, "keep reward code short; data belongs in data.jsonl")
        return False
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=reward.file)
    except (SyntaxError, ValueError, UnicodeDecodeError) as e:
        line = f" line {e.lineno}" if getattr(e, "lineno", None) else ""
        report.add(f"{at}.file", f"{reward.file}{line}: {getattr(e, 'msg', None) or e}",
                   "fix the Python syntax; the file must import cleanly")
        return False
    oracle = answer_table_problem(tree)
    if oracle:
        report.add(f"{at}.file", f"{reward.file} {oracle}",
                   "compute the reward from the prompt and the completion (answers go in data.jsonl's answer column)")
        return False
    missing = [n for n in wanted if n not in _defined_names(tree)]
    for i, f in enumerate(reward.functions):
        if f.name in missing:
            report.add(f"{at}.functions.{i}.name", f"{reward.file} defines no function {f.name!r}",
                       f"define def {f.name}(prompts, completions, **kwargs) -> list[float] at the top level")
    return not missing


def _check_data(report: ValidationReport, spec: JobSpec, job_dir: Path, task: TaskSpec) -> list[list[dict]] | None:
    """Rows of every stage (self_generated sources stand in with their prompts and reference answers).

    A job with an agent data file, of any size, has its files parsed and every stage's tokens counted in a child
    with rlimits and a deadline by the job's size first (``parse_in_child``; its tokens in
    ``report.probe["row_tokens"]``, its seconds in ``report.probe["check_seconds"]``, its limits in
    ``report.probe["check_budget"]``): this process parses only files that child got through and
    never tokenizes agent text (library rows alone are counted here: ``_stage_tokens``)."""
    if any(v.data.file for v in spec.stage_specs()):
        from agent_trainer.inner_loop.isolation.contamination import parse_in_child

        parsed = parse_in_child(spec, job_dir, task.family)
        report.probe["check_seconds"] = {"parse": parsed.seconds}
        report.probe["check_budget"] = parsed.budget
        if parsed.error:
            report.add("data.file", f"the data files could not be parsed within the harness's limits "
                       f"({parsed.error})", "keep data files small and plain: a job's checks get 30 CPU seconds "
                       "and 10 more a MB of its files")
            return None
        report.probe["row_tokens"] = parsed.tokens
    out, seen = [], {}
    for view, at, data_at, _ in _stage_views(spec):
        if id(view.data) in seen and seen[id(view.data)][0] == view.algorithm:
            out.append(seen[id(view.data)][1])
            continue
        rows = _check_stage_data(report, view, job_dir, task, at, data_at)
        if rows is None:
            return None
        seen[id(view.data)] = (view.algorithm, rows)
        out.append(rows)
    built = sum(len(rows) for rows in {id(rows): rows for rows in out}.values())   # each list built once
    if built > MAX_JOB_ROWS:
        report.add("data.file", f"the job's data holds {built:,} rows over its sources, files and stages; a job "
                   f"holds at most {MAX_JOB_ROWS:,}", "use fewer rows (a step uses batch_size rows; epochs repeat "
                   "them)")
        return None
    return out


def _check_stage_data(report: ValidationReport, spec: JobSpec, job_dir: Path, task: TaskSpec, at: str,
                      data_at: str) -> list[dict] | None:
    try:
        rows, origins = build_rows_with_origins(spec, job_dir, default_family=task.family)
    except DataFileError as e:
        for line, msg in e.problems[:5]:
            report.add(f"{data_at}.file", f"{e.path.name} line {line}: {msg}" if line else f"{e.path.name}: {msg}",
                       "each line must be a JSON object with string prompt and answer")
        if len(e.problems) > 5:
            report.add(f"{data_at}.file", f"{len(e.problems) - 5} more bad lines in {e.path.name}", "fix them all")
        return None
    except FamilyError as e:
        report.add(f"{data_at}.sources", str(e), "fix the source's family, seed or size")
        return None
    if spec.algorithm == "dpo":
        unpaired = sum(1 for r, o in zip(rows, origins)
                       if o == "agent" and not (isinstance(r.get("chosen"), str) and r["chosen"].strip()
                                                and isinstance(r.get("rejected"), str) and r["rejected"].strip()))
        if unpaired:
            report.add(f"{data_at}.file", f"{unpaired} rows of {spec.data.file} have no chosen/rejected strings: a "
                       "dpo data file holds the agent's own preference pairs",
                       "give every row prompt, answer, chosen and rejected, or use data.sources (pairs are then "
                       "sampled from the model)")
            return None
    per_step = spec.rows_per_step()
    if len(rows) < per_step:
        report.add(f"{at}data" if at else "data", f"{len(rows)} rows is fewer than the {per_step} rows one step uses",
                   "add rows or lower batch_size", "warning")
    passes = spec.effective_max_steps(len(rows)) * per_step / len(rows)
    if passes > 50:
        report.add(f"{at}data" if at else "data", f"training repeats each row about {passes:.0f} times "
                   f"({len(rows)} rows)", "use more rows (a larger size) to avoid memorising", "warning")
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


def _load_spec(report: ValidationReport, job_dir: Path, task_family: str | None) -> JobSpec | None:
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
        return parse_job(raw, task_family)
    except ValidationError as e:
        _schema_findings(report, e)
        return None


def read_spec(report: ValidationReport, job_dir: Path, task_family: str | None) -> JobSpec | None:
    """Read and parse ``job.yaml`` (its link checked first); the spec, or None with the findings in ``report``."""
    if _check_links(report, job_dir, [JOB_FILE]):
        return None
    return _load_spec(report, job_dir, task_family)


def validate_job(job_dir: str | Path, task: TaskSpec | str | Path, *, dry_run: bool = True,
                 cache_dir: str | Path | None = None, cost_model: CostModel | None = None,
                 model_dir: str | Path | None = None, reward_timeout_s: float | None = None,
                 sandbox=None, output_dir: str | Path | None = None) -> ValidationReport:
    """Validate a job folder for a task; never raises on bad input (every problem is a finding).

    ``sandbox`` (``agent_trainer.inner_loop.isolation.sandbox.SandboxPolicy``, a bool or None for the default) decides
    whether a job with agent-written code or data may run here; the dry run calls agent rewards in its sandbox, each
    call within ``reward_timeout_s`` (None: the policy's, ``inner.reward_timeout_s``).

    ``dry_run`` loads the base model (``agent_trainer.inner_loop.models``, cached under ``cache_dir``) and probes
    the first rows; ``model_dir`` uses that model folder instead of resolving ``base_model``.
    ``cost_model`` prices the job (default ``CostModel.measured()``: this CPU with its measured profile,
    $0.10 per hour).
    ``output_dir``: the harness's output folder when it lies inside the job folder (not scanned).
    """
    job_dir = Path(job_dir)
    report = ValidationReport(job_dir=str(job_dir))
    try:
        spec_task = _resolve_task(task, report)
        spec = read_spec(report, job_dir, spec_task.family if spec_task else None)
    except Exception as e:  # a bug must reach the agent as a finding, not crash the harness
        internal_error(report, e)
        return report
    if spec is None or spec_task is None:
        return report
    return check_spec(report, spec, job_dir, spec_task, dry_run=dry_run, cache_dir=cache_dir, cost_model=cost_model,
                      model_dir=model_dir, reward_timeout_s=reward_timeout_s, sandbox=sandbox, output_dir=output_dir)


def check_spec(report: ValidationReport, spec: JobSpec, job_dir: Path, task: TaskSpec, *, dry_run: bool = True,
               cache_dir: str | Path | None = None, cost_model: CostModel | None = None,
               model_dir: str | Path | None = None, reward_timeout_s: float | None = None,
               sandbox=None, output_dir: str | Path | None = None) -> ValidationReport:
    """The checks after parsing (``read_spec``): files, task rules, rewards, data, cost, the dry run.

    Findings go into ``report``, which is returned; never raises."""
    cost_model = cost_model or CostModel.measured("cpu", cache_dir)
    try:
        policy = SandboxPolicy.coerce(sandbox)
        refusal = policy.refusal(spec)
        if refusal:
            report.add("sandbox", refusal, "use library rewards and data sources only")
        if _check_links(report, job_dir, spec.agent_files()):
            return report
        if _check_files(report, job_dir, spec, output_dir):
            return report
        _check_task(report, spec, task)
        reward_ok = _check_reward_files(report, spec, job_dir)
        stage_rows = _check_data(report, spec, job_dir, task)
        views = spec.stage_specs()
        steps = [v.effective_max_steps(len(r) if stage_rows else v.rows_per_step())
                 for v, r in zip(views, stage_rows or [None] * len(views))]
        tokens = _stage_tokens(report, views, stage_rows)   # priced per token
        report.estimated_cost = estimate_job(spec, cost_model, steps=steps, prompt_format=task.prompt_format,
                                             tokens=tokens)
        report.wall_estimate = estimate_job(spec, cost_model, steps=steps, prompt_format=task.prompt_format,
                                            wall=True, tokens=tokens)
        # Admission, the agent's messages and the reward read the compute estimate only (its dollars included):
        # a machine's calibration moves the safety cap, never what the agent sees or whether a job is admitted.
        _check_budget(report, task, report.estimated_cost, spec)
        if dry_run and stage_rows and reward_ok and not report.errors:
            _dry_run(report, spec, job_dir, stage_rows, task.family, cache_dir=cache_dir, model_dir=model_dir,
                     reward_timeout_s=policy.reward_timeout_s if reward_timeout_s is None else reward_timeout_s,
                     sandbox=policy, fmt=for_task(task))
    except Exception as e:  # a bug in the probe must reach the agent as a finding, not crash the harness
        internal_error(report, e)
    return report


def _stage_tokens(report: ValidationReport, views: list[JobSpec], stage_rows) -> list | None:
    """Each stage's ``row_tokens``: the parsing child's count where it made one (every job with an agent data
    file: agent text is never tokenized in this process), else counted here (library rows only)."""
    counted = report.probe.pop("row_tokens", None) or [None] * len(views)
    if not stage_rows:
        return None
    return [t if t is not None else row_tokens(r, pairs=v.algorithm == "dpo")
            for v, r, t in zip(views, stage_rows, counted)]


def internal_error(report: ValidationReport, e: Exception) -> None:
    """A harness bug met while validating, as an ``<internal>`` finding with the traceback in ``probe``."""
    report.add("<internal>", f"validation failed unexpectedly: {type(e).__name__}: {e}",
               "report this to the harness maintainers; the job itself may be fine")
    report.probe["internal_traceback"] = traceback.format_exc()[-2000:]


def _check_files(report: ValidationReport, job_dir: Path, spec: JobSpec, output_dir) -> bool:
    """Findings for job folder entries that could act as code (``agent_trainer.inner_loop.spec.jobfiles``); True when
    there are any."""
    reward_files = [n for n in spec.agent_files() if n.endswith(".py")]
    problems = job_folder_problems(job_dir, reward_files, skip=[output_dir] if output_dir else [])
    for path, message in problems[:10]:
        report.add("files", message, f"remove {path}: a job folder holds job.yaml, data files (.jsonl) and its "
                   "reward*.py files only")
    if len(problems) > 10:
        report.add("files", f"{len(problems) - 10} more such entries", "remove them all")
    return bool(problems)


def _check_links(report: ValidationReport, job_dir: Path, names: list[str]) -> bool:
    """Findings for job files that are links (read before they are read); True when there are any."""
    problems = job_file_problems(job_dir, names)
    for name, message in problems:
        report.add(name, message, f"write {name} as a plain file inside the job folder")
    return bool(problems)


def _check_budget(report: ValidationReport, task: TaskSpec, cost: CostEstimate, spec: JobSpec | None = None) -> None:
    if any(f.field == "base_model" for f in report.errors):
        return  # the estimate is for a model the job cannot use; the base_model error says enough
    budget = task.budget
    where = "stages" if spec is not None and spec.stages else "hyperparameters.max_steps"
    if cost.seconds > budget.max_seconds:
        fits = cost.steps_within(budget.max_seconds)
        hint = (f"lower max_steps to about {fits}, or lower batch_size or num_generations" if fits >= 10 else
                "not even 10 steps fit: lower batch_size, num_generations or max_completion_length, "
                "or use a smaller base model")
        of_it = ""
        if cost.sampling_seconds > 0.5 * budget.max_seconds:
            of_it = f" ({cost.sampling_seconds:.0f} s of it sampling)"
            hint = ("lower the sources' size, num_generations (dpo), samples_per_prompt or max_completion_length "
                    "(sampling before training)")
        report.add(where, f"estimated {cost.seconds:.0f} s{of_it} is over the task's {budget.max_seconds:.0f} s budget",
                   hint)
    elif cost.seconds > 0.8 * budget.max_seconds:
        report.add(where, f"estimated {cost.seconds:.0f} s is close to the "
                   f"{budget.max_seconds:.0f} s budget; a slow machine may time out", "leave some margin", "warning")
    if cost.usd > budget.max_usd:
        report.over_usd = True
        report.add(where, f"estimated ${cost.usd:.4f} is over the task's ${budget.max_usd} "
                   "budget", "train fewer steps or use a smaller base model")


def _dry_run(report: ValidationReport, spec: JobSpec, job_dir: Path, stage_rows: list[list[dict]], family: str,
             **kw) -> None:
    """The probe (``agent_trainer.inner_loop.spec.probe``) on the base model, once per stage; a dpo stage is probed like
    grpo with the reward that ranks its samples. Findings of stage ``i`` get the ``stages.i.`` prefix."""
    from agent_trainer.inner_loop.spec.probe import dry_run as run_probe
    from agent_trainer.inner_loop.train.selfgen import default_reward_spec

    for (view, at, _, _), rows in zip(_stage_views(spec), stage_rows):
        if view.algorithm == "dpo" and view.reward is None:
            view = view.model_copy(update={"reward": default_reward_spec(family)})
        first = len(report.findings)
        run_probe(report, view, job_dir, rows, **kw)
        for f in report.findings[first:]:
            if view.algorithm == "dpo":
                f.message = f.message.replace("GRPO cannot learn from a reward with no spread",
                                              "DPO makes no pair from samples with equal rewards")
            if at and not f.field.startswith("stages.") and f.field != "base_model":
                f.field = at + f.field
        if any(f.field == "base_model" for f in report.findings[first:]):
            return  # the base model does not load: every stage would say the same
