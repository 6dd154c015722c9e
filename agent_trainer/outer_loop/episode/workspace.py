"""The agent's workspace: a fresh folder per episode with the task and a short guide, and path rules.

    >>> from agent_trainer.outer_loop.episode.workspace import Workspace
    >>> ws = Workspace.create("runs/r1/episodes/0/workspace", task)      # task: agent_trainer.evaluation.tasks.TaskSpec
    >>> ws.resolve("job.yaml")                   # a Path inside the workspace
    >>> ws.resolve("../secrets")                 # WorkspaceError: the message says what is allowed

It starts with ``task.json`` (the task as the agent may see it) and ``GUIDE.md`` (the ``job.yaml`` schema, the
reward library, the workflow). The path rules confine the agent's tools to the workspace; agent-written code
runs only in the inner job's sandbox (docs/security.md).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

from agent_trainer.inner_loop.spec.jobfiles import code_name_problem

TASK_FILE = "task.json"
GUIDE_FILE = "GUIDE.md"


class WorkspaceError(ValueError):
    """A path or size the workspace refuses; the message is written for the agent."""


class Workspace:
    """One episode's folder and the rules for touching it."""

    def __init__(self, root: str | Path, *, max_file_bytes: int = 256_000, max_total_bytes: int = 4_000_000):
        self.root = Path(root).resolve()
        self.max_file_bytes = max_file_bytes
        self.max_total_bytes = max_total_bytes

    @classmethod
    def create(cls, root: str | Path, task, **limits: Any) -> "Workspace":
        """A fresh workspace for ``task`` (an ``agent_trainer.evaluation.tasks.TaskSpec``); an existing folder is
        replaced."""
        root = Path(root)
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
        ws = cls(root, **limits)
        (ws.root / TASK_FILE).write_text(json.dumps(visible_task(task), indent=2) + "\n")
        (ws.root / GUIDE_FILE).write_text(guide_text(task))
        return ws

    # --- paths ------------------------------------------------------------------------------
    def resolve(self, path: str, *, for_write: bool = False) -> Path:
        """The absolute path of ``path`` inside the workspace, or ``WorkspaceError`` saying why not."""
        if not isinstance(path, str) or not path.strip():
            raise WorkspaceError("path must be a non-empty relative path such as job.yaml or data/train.jsonl")
        if "\x00" in path or "\\" in path:
            raise WorkspaceError(f"path {path!r} has a backslash or NUL; use forward slashes, e.g. data/train.jsonl")
        p = PurePosixPath(path)
        if p.is_absolute() or path.startswith("~"):
            raise WorkspaceError(f"path {path!r} is absolute; use a path relative to the workspace, e.g. job.yaml")
        if ".." in p.parts:
            raise WorkspaceError(f"path {path!r} leaves the workspace ('..'); only files inside it can be used")
        if len(path.encode("utf-8", "surrogatepass")) > 1024 or any(len(x.encode("utf-8", "surrogatepass")) > 255
                                                                    for x in p.parts):
            raise WorkspaceError(f"path {path[:40]!r}... is too long; use short names (at most 255 bytes a part)")
        target = self.root.joinpath(*p.parts) if p.parts != (".",) else self.root
        real = target.resolve()
        if real != self.root and self.root not in real.parents:
            raise WorkspaceError(f"path {path!r} resolves outside the workspace (a symlink); use a plain file")
        if for_write:
            # A symlink inside the workspace pointing inside is harmless to read, but writing through
            # links is refused outright: nothing legitimate needs it.
            for parent in [target, *target.parents]:
                if parent == self.root:
                    break
                if parent.is_symlink():
                    raise WorkspaceError(f"path {path!r} goes through a symlink; write to a plain path")
        return real

    def relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix() or "."

    def total_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.root.rglob("*") if f.is_file() and not f.is_symlink())

    # --- file operations (used by the tools) ------------------------------------------------
    def write(self, path: str, content: str) -> Path:
        """Write a text file (parents created), within the size limits."""
        target = self.resolve(path, for_write=True)
        if target == self.root or target.is_dir():
            raise WorkspaceError(f"{path!r} is a folder; give a file name such as {path.rstrip('/')}/job.yaml")
        code = code_name_problem(self.relative(target))
        if code:
            raise WorkspaceError(f"{path!r} is refused: {code}. Write job.yaml, data files (.jsonl) and reward.py")
        data = content.encode("utf-8")
        if len(data) > self.max_file_bytes:
            raise WorkspaceError(f"{path}: {len(data)} bytes is over the {self.max_file_bytes}-byte file limit; "
                                 f"write less (e.g. fewer data rows: library data sources need no file)")
        old = target.stat().st_size if target.is_file() else 0
        if self.total_bytes() - old + len(data) > self.max_total_bytes:
            raise WorkspaceError(f"the workspace would exceed {self.max_total_bytes} bytes; delete or shrink files")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return target

    def read(self, path: str, *, offset: int = 0, max_chars: int = 8000) -> tuple[str, int]:
        """(text from ``offset``, total characters); binary files are refused."""
        target = self.resolve(path)
        if not target.exists():
            raise WorkspaceError(f"{path!r} does not exist; list_files shows what is there")
        if target.is_dir():
            raise WorkspaceError(f"{path!r} is a folder; use list_files with path {path!r}")
        if target.stat().st_size > 50 * self.max_file_bytes:
            raise WorkspaceError(f"{path!r} is too large to read here ({target.stat().st_size} bytes)")
        try:
            text = target.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise WorkspaceError(f"{path!r} is not a UTF-8 text file") from None
        return text[offset:offset + max_chars], len(text)

    def listing(self, path: str = ".", *, max_entries: int = 200) -> list[str]:
        """Files and folders under ``path`` (folders end in '/'), sorted, relative to the workspace."""
        base = self.resolve(path)
        if not base.is_dir():
            raise WorkspaceError(f"{path!r} is not a folder; read_file reads files")
        out = []
        for f in sorted(base.rglob("*")):
            rel = self.relative(f) if self.root in f.parents else f.name
            out.append(rel + ("/" if f.is_dir() else f"  ({f.stat().st_size} bytes)" if f.is_file() else " -> link"))
            if len(out) >= max_entries:
                out.append(f"... (more than {max_entries} entries)")
                break
        return out


# --- what the agent reads ------------------------------------------------------------------


def visible_task(task) -> dict[str, Any]:
    """The task spec without what only the harness knows (hidden-eval size, held-out flag)."""
    data = task.model_dump(mode="json")
    for hidden in ("hidden_eval_size", "held_out"):
        data.pop(hidden, None)
    try:
        from agent_trainer.evaluation.families import get_family

        desc = get_family(task.family).describe()
        data["family_info"] = {k: v for k, v in desc.items() if k not in ("held_out", "family", "version")}
    except Exception:  # the family registry is the harness's; a task that loaded has a family
        pass
    return data


def guide_text(task=None) -> str:
    """GUIDE.md: workflow, job.yaml schema (from the JobSpec field descriptions), reward library."""
    lines = [
        "# Guide",
        "",
        "Your goal: write a training job that makes the base model better at the task in task.json.",
        "You are rewarded by how much the trained model improves on a hidden evaluation set.",
        "",
        "## Workflow",
        "1. read_file task.json (the task, the allowed base models, the budget).",
        "2. lookup_baseline for an allowed base model: its score before training.",
        "3. write_file job.yaml (and optionally data.jsonl or reward.py next to it).",
        "4. validate_job: fix every error it reports, then validate again (a valid first try earns most).",
        "5. submit_job: the job trains; you see its status, training curves, time and cost.",
        "6. finish: end the episode.",
        "",
        "## job.yaml",
    ]
    try:
        from agent_trainer.inner_loop.spec.jobspec import JobSpec

        lines += _schema_lines(JobSpec, indent=0)
    except Exception as e:  # the guide must still be written if the schema module is broken
        lines.append(f"(schema unavailable: {type(e).__name__}; validate_job lists the fields it expects)")
    lines += ["", "Strategies: algorithm sft | grpo | dpo; data curated (sources), self_generated (sft) or your "
              "data.jsonl; stages to chain them (e.g. sft then grpo)."]
    lines += ["", "## Reward library (reward.functions[].name with source: library)"]
    try:
        from agent_trainer.inner_loop.train.rewards import describe_library

        lines += [f"- {r['name']}: {r['description']}" for r in describe_library()]
    except Exception as e:
        lines.append(f"(library unavailable: {type(e).__name__})")
    if task is not None:
        lines += ["", f"Allowed base models: {', '.join(task.allowed_base_models)}.",
                  f"Budget per job: {task.budget.max_steps} steps, {task.budget.max_seconds:g} s, "
                  f"${task.budget.max_usd:g}."]
    return "\n".join(lines) + "\n"


def _schema_lines(model, indent: int, shown: set | None = None) -> list[str]:
    """One line per field: name, type, default, description; nested models expanded below, once each."""
    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined

    shown = set() if shown is None else shown
    out = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        nested = _nested_model(ann, BaseModel)
        typ = _type_name(ann)
        shown_default = ((f.json_schema_extra or {}).get("shown_default") if isinstance(f.json_schema_extra, dict)
                         else None)
        if shown_default:  # filled in from the task when left out
            default = f"default: {shown_default}"
        elif f.is_required():
            default = "required"
        elif f.default_factory is not None:
            value = f.default_factory()
            default = "default: []" if isinstance(value, list) else "default: see below"
        else:
            default = f"default: {_yaml_value(f.default)}" if f.default is not PydanticUndefined else ""
        desc = f" - {f.description}" if f.description else ""
        if nested is not None and nested in shown:  # a stage repeats the job's blocks: point at them
            desc += " (fields as above)"
        out.append(f"{'  ' * indent}- {name} ({typ}; {default}){desc}")
        if nested is not None and nested not in shown:
            shown.add(nested)
            out += _schema_lines(nested, indent + 1, shown)
    return out


def _yaml_value(v) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def _nested_model(ann, base):
    import typing

    for a in (ann, *typing.get_args(ann)):
        if isinstance(a, type) and issubclass(a, base):
            return a
        for b in typing.get_args(a):
            if isinstance(b, type) and issubclass(b, base):
                return b
    return None


def _type_name(ann) -> str:
    """``Literal['a', 'b']`` -> ``a | b``; ``list[X]`` -> ``list of X``; ``X | None`` -> ``X | null``."""
    import types
    import typing

    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is list:
        return "list of " + _type_name(args[0]) if args else "list"
    if ann is type(None):
        return "null"
    return getattr(ann, "__name__", None) or str(ann).replace("typing.", "")
