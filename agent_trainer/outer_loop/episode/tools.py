"""The agent's tools: JSON schemas (OpenAI function format) and a ``ToolBox`` that never raises.

    >>> from agent_trainer.outer_loop.episode.tools import ToolBox, ToolLimits
    >>> box = ToolBox(workspace, task, limits=ToolLimits(max_turns=8, max_jobs_per_episode=2),
    ...               jobs_dir="runs/r1/episodes/0/jobs", ledger=ledger, episode="0")
    >>> tools = box.schemas()                          # give these to AgentBackend.generate
    >>> box.call("write_file", {"path": "job.yaml", "content": "..."})   # ToolResult(text, ok, data)
    >>> box.state.outcome(task)                        # harness side: inputs of the staged reward

Tools: ``list_files``, ``read_file``, ``write_file``, ``lookup_baseline``, ``validate_job``, ``submit_job``,
``finish``; a bad call is ``ToolResult(ok=False)`` with a message the agent can act on. ``submit_job`` runs
a copy of the job folder and shows the agent ``JobResult.visible()`` only (never the hidden score).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from agent_trainer.inner_loop.run.cache import folder_digest
from agent_trainer.inner_loop.run.request import JobRequest, JobSettings
from agent_trainer.outer_loop.episode.workspace import Workspace, WorkspaceError


@dataclass
class ToolResult:
    """What a tool call returns: the text the agent reads, success, and structured data for logs."""

    text: str
    ok: bool = True
    data: dict[str, Any] | None = None


@dataclass
class ToolLimits:
    """One tool box's limits: its turns and jobs (an episode gives its ``agent.max_turns`` and
    ``budget.max_jobs_per_episode``; a tool box also runs without an episode: the tiny agent's demonstrations,
    tests), and the characters a read and a tool result show the agent."""

    max_turns: int
    max_jobs_per_episode: int
    max_read_chars: int = 8000
    max_result_chars: int = 6000


@dataclass
class PendingJob:
    """A submitted job snapshot waiting to be run (``ToolBox(defer_jobs=True)``)."""

    index: int
    job_dir: Path
    output_dir: Path
    agent_path: str


@dataclass
class EpisodeState:
    """What happened in the episode, for the trajectory and the staged reward."""

    turns: int = 0
    validations: list[bool] = field(default_factory=list)
    jobs: list[Any] = field(default_factory=list)  # agent_trainer.inner_loop.run.job.JobResult, harness-only
    finished: bool = False
    summary: str = ""
    pending: list["PendingJob"] = field(default_factory=list)  # submitted, not yet run (deferred mode)
    # Jobs submitted unchanged after validate_job called them INVALID (a habit to watch in RL:
    # docs/results/2026-12-04-smollm2-recipe-first-seeds.md)
    submitted_unfixed: int = 0
    invalid_seen: dict[str, str] = field(default_factory=dict)  # job folder -> digest of what validation refused
    last_valid: tuple[str, str] | None = None  # (job folder, digest) of the last job validate_job called VALID
    harness_submitted: int = 0   # jobs the harness submitted for the agent at the turn limit (submit_last_valid)
    refused_calls: int = 0       # calls refused before a tool ran: unknown tool, bad arguments, a path it may not use

    @property
    def submitted(self) -> int:
        """Jobs submitted so far, run or pending."""
        return len(self.jobs) + len(self.pending)

    def validation_failures(self) -> int | None:
        """Invalid validations before the first valid one; None when never valid."""
        if True not in self.validations:
            return None
        return self.validations.index(True)

    def outcome(self, task, pick: str = "last"):
        """``agent_trainer.evaluation.staged_reward.JobOutcome`` of the last (or ``best``-scoring) submitted job, or
        None."""
        if not self.jobs:
            return None
        res = self.jobs[-1] if pick == "last" else max(self.jobs, key=lambda r: r.hidden_score or -1.0)
        return res.outcome(task.budget.max_seconds)


def tool_schema(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An OpenAI-style function schema: ``name``, ``description``, an object of ``properties`` (no others)."""
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": False}}}


_PATH = {"type": "string", "description": "path relative to the workspace, e.g. job.yaml"}
_JOB = {"type": "string", "description": "the job folder (or its job.yaml) relative to the workspace; default '.'"}

SCHEMAS: list[dict[str, Any]] = [
    tool_schema("list_files", "List the files in the workspace (or in a folder of it).",
                {"path": {"type": "string", "description": "folder relative to the workspace; default '.'"}}, []),
    tool_schema("read_file", "Read a text file of the workspace (long files in pages: pass offset).",
                {"path": _PATH, "offset": {"type": "integer", "description": "first character to return; default 0"}},
                ["path"]),
    tool_schema("write_file", "Create or overwrite a text file in the workspace (job.yaml, data.jsonl, reward.py).",
                {"path": _PATH, "content": {"type": "string", "description": "the whole file content"}},
                ["path", "content"]),
    tool_schema("lookup_baseline", "The hidden-evaluation score of a base model before any training.",
                {"model": {"type": "string", "description": "a base model allowed by task.json, e.g. tiny-s"},
                 "family": {"type": "string", "description": "task family; default: the task's"}}, ["model"]),
    tool_schema("validate_job", "Check a job without training it: schema, task rules, budget, a dry run.",
                {"path": _JOB}, []),
    tool_schema("submit_job", "Train the job (counts against the job limit). Returns status, training curves, "
                "time and cost; the hidden score is never shown.", {"path": _JOB}, []),
    tool_schema("finish", "End the episode.",
                {"summary": {"type": "string", "description": "one line on what you did and why"}}, []),
]

_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list}


def check_arguments(schema: dict[str, Any], arguments: Any) -> tuple[dict[str, Any] | None, str]:
    """(arguments as a dict, "") or (None, what is wrong), against a function schema's parameters."""
    params = schema["function"]["parameters"]
    name = schema["function"]["name"]
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            return None, f"{name}: arguments are not valid JSON ({e.msg} at char {e.pos}); send a JSON object"
        except (ValueError, RecursionError):  # a number of thousands of digits, nesting too deep
            return None, f"{name}: arguments cannot be read (too deeply nested or a huge number); send a JSON object"
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None, f"{name}: arguments must be a JSON object, got {type(arguments).__name__}"
    props = params["properties"]
    unknown = sorted(set(arguments) - set(props))
    if unknown:
        return None, f"{name}: unknown argument(s) {', '.join(unknown)}; it takes: {', '.join(props) or 'nothing'}"
    missing = [k for k in params["required"] if k not in arguments]
    if missing:
        return None, f"{name}: missing required argument(s) {', '.join(missing)}"
    for key, value in arguments.items():
        want = props[key]["type"]
        ok = isinstance(value, _TYPES[want]) and not (want in ("integer", "number") and isinstance(value, bool))
        if not ok:
            return None, f"{name}: argument {key} must be of type {want}, got {type(value).__name__} ({value!r:.40})"
        if isinstance(value, str) and not _utf8(value):
            return None, f"{name}: argument {key} holds characters that are not valid Unicode (lone surrogates)"
    return arguments, ""


def _utf8(text: str) -> bool:
    """False for text with lone surrogates (from JSON ``\\udXXX`` escapes): no file or template can hold it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class ToolBox:
    """The tools of one episode, bound to its workspace, task, ledger and limits."""

    def __init__(self, workspace: Workspace, task, *, limits: ToolLimits, jobs_dir: str | Path,
                 ledger=None, episode: str = "0", device: str | None = None, job_settings: JobSettings | None = None,
                 validate_kwargs: dict[str, Any] | None = None, compute_missing_baselines: bool = True,
                 defer_jobs: bool = False):
        self.ws, self.task = workspace, task
        self.limits = limits
        self.jobs_dir = Path(jobs_dir).resolve()
        if self.jobs_dir == self.ws.root or self.ws.root in self.jobs_dir.parents:
            raise ValueError(f"jobs_dir {self.jobs_dir} is inside the workspace; the agent could read hidden "
                             f"scores there: put it next to the workspace, e.g. <episode>/jobs")
        self.job_settings = job_settings or JobSettings()
        # the ledger's label of this episode's jobs: where they run (hardware.device)
        self.ledger, self.episode, self.device = ledger, episode, device or self.job_settings.device
        self.validate_kwargs = dict(validate_kwargs or {})
        # validate_job checks as submit_job will run: the jobs' sandbox policy (its dry run calls agent rewards),
        # their cache and base-model folder, their prices (hardware.usd_per_hour)
        js = self.job_settings
        for key, value in (("sandbox", js.sandbox), ("cache_dir", js.cache_dir), ("model_dir", js.model_dir)):
            self.validate_kwargs.setdefault(key, value)
        if "cost_model" not in self.validate_kwargs:
            self.validate_kwargs["cost_model"] = js.cost()
        self.compute_missing_baselines = compute_missing_baselines
        self.defer_jobs = defer_jobs
        self.state = EpisodeState()
        self._impl: dict[str, Callable[..., ToolResult]] = {
            "list_files": self._list_files, "read_file": self._read_file, "write_file": self._write_file,
            "lookup_baseline": self._lookup_baseline, "validate_job": self._validate_job,
            "submit_job": self._submit_job, "finish": self._finish,
        }
        self._schemas = {s["function"]["name"]: s for s in SCHEMAS}

    # --- the episode runner's side --------------------------------------------------------
    def register(self, schema: dict[str, Any], impl: Callable[..., ToolResult]) -> None:
        """Add a tool (the strategy group's journal, skill and decide tools); arguments are checked by its schema."""
        name = schema["function"]["name"]
        self._schemas[name], self._impl[name] = schema, impl

    def schemas(self) -> list[dict[str, Any]]:
        """Tool schemas in OpenAI function format."""
        return [self._schemas[n] for n in self._impl]

    def next_turn(self) -> bool:
        """Count one agent turn; False once ``max_turns`` turns have been taken."""
        if self.state.turns >= self.limits.max_turns:
            return False
        self.state.turns += 1
        return True

    @property
    def done(self) -> bool:
        """No more agent turns: finished, out of turns, or every allowed job submitted."""
        return (self.state.finished or self.state.turns >= self.limits.max_turns
                or self.state.submitted >= self.limits.max_jobs_per_episode)

    def call(self, name: str, arguments: Any = None) -> ToolResult:
        """Run one tool call; every failure is a ``ToolResult(ok=False)`` with a message, never an exception."""
        if not isinstance(name, str) or name not in self._impl:
            return self._refused(f"unknown tool {name!r:.80}; the tools are: {', '.join(self._impl)}")
        if self.state.finished:
            return self._refused("the episode is finished; no more tool calls are run")
        args, problem = check_arguments(self._schemas[name], arguments)
        if args is None:
            return self._refused(problem)
        try:
            result = self._impl[name](**args)
        except WorkspaceError as e:
            result = self._refused(str(e))
        except OSError as e:  # the file system refused (a name it cannot hold, no space): say so, not where
            result = self._refused(f"{name}: the file system refused it ({e.strerror or type(e).__name__})")
        except Exception as e:  # a tool's own bug must not end the episode; the agent sees a short line
            result = ToolResult(f"{name} failed: {type(e).__name__}: {e}", ok=False)
        if len(result.text) > self.limits.max_result_chars:
            cut = self.limits.max_result_chars
            result.text = result.text[:cut] + f"\n... ({len(result.text) - cut} more characters cut)"
        return result

    def _refused(self, text: str) -> ToolResult:
        """A call no tool ran for (counted in ``state.refused_calls``); a tool's own verdicts are not refusals."""
        self.state.refused_calls += 1
        return ToolResult(text, ok=False)

    # --- tools ------------------------------------------------------------------------------
    def _list_files(self, path: str = ".") -> ToolResult:
        entries = self.ws.listing(path)
        return ToolResult("\n".join(entries) if entries else "(empty)", data={"entries": entries})

    def _read_file(self, path: str, offset: int = 0) -> ToolResult:
        if offset < 0:
            return ToolResult("offset must be >= 0", ok=False)
        text, total = self.ws.read(path, offset=offset, max_chars=self.limits.max_read_chars)
        if offset and offset >= total:
            return ToolResult(f"offset {offset} is past the end of {path} ({total} characters)", ok=False)
        if not total:
            return ToolResult(f"{path} is empty", data={"path": path, "offset": 0, "chars": 0, "total": 0})
        end = offset + len(text)
        more = f"\n... ({total - end} more characters; read_file with offset {end})" if end < total else ""
        return ToolResult(text + more, data={"path": path, "offset": offset, "chars": len(text), "total": total})

    def _write_file(self, path: str, content: str) -> ToolResult:
        target = self.ws.write(path, content)
        rel = self.ws.relative(target)
        return ToolResult(f"wrote {rel} ({len(content.encode())} bytes)", data={"path": rel})

    def _lookup_baseline(self, model: str, family: str | None = None) -> ToolResult:
        family = family or self.task.family
        from agent_trainer.evaluation.families import FAMILIES

        if family not in FAMILIES:
            return ToolResult(f"unknown family {family!r:.60}; this task's family is {self.task.family}", ok=False)
        try:
            from agent_trainer.inner_loop.models import resolve_model

            path = resolve_model(model, cache_dir=self.job_settings.cache_dir)
        except Exception as e:
            return ToolResult(f"cannot use base model {model!r}: {e}; allowed for this task: "
                              f"{', '.join(self.task.allowed_base_models)}", ok=False)
        from agent_trainer.evaluation import baselines
        from agent_trainer.evaluation.prompts import for_family, for_task

        n = self.task.hidden_eval_size
        fmt = for_task(self.task) if family == self.task.family else for_family(family, self.task.prompt_format)
        cache = self.job_settings.cache_dir
        value = baselines.lookup_baseline(path, family, n, cache_dir=cache, fmt=fmt)
        if value is None and self.compute_missing_baselines:
            from agent_trainer.inner_loop.run.job import eval_device

            device = eval_device(self.job_settings.device, self.job_settings.gpus)
            value = baselines.get_baseline(path, family, n, cache_dir=cache, device=device, fmt=fmt)
        if value is None:
            return ToolResult(f"no baseline of {model} on {family} is known yet", ok=False)
        score = float(getattr(value, "score", value))
        return ToolResult(f"baseline of {model} on {family}: {score:.4f} (hidden-evaluation score before training)",
                          data={"model": model, "family": family, "score": score})

    def _job_dir(self, path: str) -> Path:
        target = self.ws.resolve(path or ".")
        job_dir = target.parent if target.is_file() else target
        if not (job_dir / "job.yaml").is_file():
            raise WorkspaceError(f"no job.yaml in {self.ws.relative(job_dir)!r}; write_file job.yaml first")
        return job_dir

    def _validate_job(self, path: str = ".") -> ToolResult:
        from agent_trainer.inner_loop.spec.validate import validate_job

        job_dir = self._job_dir(path)
        report = validate_job(job_dir, self.task, **self.validate_kwargs)
        self.state.validations.append(bool(report.ok))
        if report.ok:
            self.state.invalid_seen.pop(str(job_dir), None)
            self.state.last_valid = (str(job_dir), folder_digest(job_dir))
        else:
            self.state.invalid_seen[str(job_dir)] = folder_digest(job_dir)
        return ToolResult(report.to_text().replace(str(job_dir), self.ws.relative(job_dir)), ok=report.ok,
                          data=report.to_dict())

    def _submit_job(self, path: str = ".") -> ToolResult:
        if self.state.submitted >= self.limits.max_jobs_per_episode:
            return ToolResult(f"job limit reached ({self.limits.max_jobs_per_episode} per episode); call finish",
                              ok=False)
        job_dir = self._job_dir(path)
        if self.ledger is not None:
            from agent_trainer.outer_loop.episode.ledger import BudgetExhausted

            try:
                self.ledger.check("job", self.ledger.estimate_job(self.device, self.task.budget.max_seconds),
                                  episode=self.episode)
            except BudgetExhausted as e:
                return ToolResult(f"not submitted: {e}", ok=False)
        refused = self.state.invalid_seen.get(str(job_dir))   # hash the folder only when validation refused it
        if refused is not None and refused == folder_digest(job_dir):
            self.state.submitted_unfixed += 1
        k = self.state.submitted
        snapshot, output = self.jobs_dir / f"{k:02d}" / "job", self.jobs_dir / f"{k:02d}" / "output"
        if snapshot.parent.exists():
            shutil.rmtree(snapshot.parent)
        # Plain files only: links could point anywhere, and the job must not change under the run.
        shutil.copytree(job_dir, snapshot, symlinks=True,
                        ignore=lambda d, names: [n for n in names if (Path(d) / n).is_symlink()])
        pending = PendingJob(index=k, job_dir=snapshot, output_dir=output, agent_path=self.ws.relative(job_dir))
        if self.defer_jobs:
            # The episode runner runs every pending job of a batch in parallel, then calls complete().
            self.state.pending.append(pending)
            # With jobs left the episode waits for the result (Episode.waiting) before the agent's next turn.
            when = ("its result follows when it has run" if self.state.submitted < self.limits.max_jobs_per_episode
                    else "it runs when this episode's turns are over")
            return ToolResult(f"job {pending.agent_path} submitted; {when}", data={"pending": k})
        from agent_trainer.inner_loop.run.job import run_request

        result = run_request(JobRequest(snapshot, self.task, output, self.job_settings))
        return self.complete(pending, result)

    def submit_last_valid(self) -> ToolResult | None:
        """Submit, for the agent, the job ``validate_job`` last called VALID, when it is unchanged since and a job
        is left (``agent.submit_at_turn_limit``: the episode ran out of turns before the agent submitted it); None
        when there is no such job. The job runs and counts as one the agent submitted."""
        st = self.state
        if st.last_valid is None or st.submitted >= self.limits.max_jobs_per_episode:
            return None
        job_dir, digest = Path(st.last_valid[0]), st.last_valid[1]
        if not (job_dir / "job.yaml").is_file() or folder_digest(job_dir) != digest:
            return None
        before = st.submitted
        try:
            result = self._submit_job(self.ws.relative(job_dir))
        except (WorkspaceError, OSError) as e:
            return ToolResult(f"submit_job: {e}", ok=False)
        if st.submitted > before:
            st.harness_submitted += 1
        return result

    def complete(self, pending: "PendingJob", result) -> ToolResult:
        """Record a finished job (run here or by the episode runner) and return the agent's view of it."""
        self.state.pending = [p for p in self.state.pending if p.index != pending.index]
        self.state.jobs.append(result)
        if result.status in ("invalid", "over_budget"):
            self.state.validations.append(False)
        elif not self.state.validations or not self.state.validations[-1]:
            self.state.validations.append(True)  # valid at submission without a separate validate_job
        if self.ledger is not None:
            self.ledger.record_job(episode=self.episode, device=self.device,
                                   seconds=float(result.seconds.get("total", 0.0)),
                                   charged_seconds=result.charged_seconds, status=result.status,
                                   job_hash=result.job_hash, job_usd=result.usd)
        visible = result.visible()
        # The copy's location is the harness's business; the agent knows the job by its own path.
        text = _job_text(visible, self.limits.max_jobs_per_episode - self.state.submitted)
        text = text.replace(str(pending.job_dir), pending.agent_path).replace(str(self.jobs_dir), "<jobs>")
        return ToolResult(text, ok=result.status == "ok", data=visible)

    def _finish(self, summary: str = "") -> ToolResult:
        self.state.finished, self.state.summary = True, summary
        return ToolResult("episode finished", data={"summary": summary})


def _job_text(v: dict[str, Any], jobs_left: int) -> str:
    """The agent's view of a job result: status, errors, a few curve points, compute and cost."""
    lines = [f"job status: {v['status']}" + (f" ({v['detail']})" if v.get("detail") else "")]
    if v.get("error"):
        lines.append("error: " + str(v["error"])[-1500:])
    for f in v.get("findings") or []:
        if f.get("severity") == "error":
            lines.append(f"error {f.get('field')}: {f.get('message')}"
                         + (f" (fix: {f['hint']})" if f.get("hint") else ""))
    lines.append(f"steps: {v.get('steps', 0)} of {v.get('planned_steps', 0)}")
    for key, label in (("reward_curve", "training reward"), ("loss_curve", "training loss")):
        curve = v.get(key) or []
        if curve:
            picks = curve if len(curve) <= 6 else [curve[int(i * (len(curve) - 1) / 5)] for i in range(6)]
            lines.append(f"{label} (step: value): " + ", ".join(f"{int(s)}: {x:.3f}" for s, x in picks))
    secs = v.get("seconds") or {}
    lines.append(f"compute: {secs.get('train', 0):.1f} s training (the cost model's, as budgets count it); "
                 f"cost ${v.get('usd', 0):.4f}; jobs left: {jobs_left}")
    return "\n".join(lines)
