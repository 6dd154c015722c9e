"""The experiment journal (append-only JSONL) and the skill library, as agent tools.

    >>> j = Journal("runs/r1/journal.jsonl", episode="0")
    >>> j.write("plan", "sft, lr 3e-3, 100 steps", hypothesis="curated sft lifts the dev score",
    ...         success_criteria="dev score +0.05", abort_criteria="loss flat after 30 steps")
    >>> j.read(kind="plan", last=5)
    >>> SkillLibrary().names()                   # ['grpo_vs_sft', 'learning_rate', 'lora_vs_full', 'when_to_switch']

``journal_tools`` / ``skill_tools``: the ``(schema, impl)`` pairs a ``ToolBox`` registers when the strategy
config enables them. Entry kinds, and a journal shared by episodes: docs/strategy.md, "Journal and skills".
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from agent_trainer.outer_loop.episode.tools import ToolResult, tool_schema

KINDS = ("plan", "observation", "lesson", "eval_result", "eval_analysis")
PLAN_FIELDS = ("hypothesis", "success_criteria", "abort_criteria")
MAX_TEXT = 2000
SKILLS_DIR = Path(__file__).resolve().parent.parent / "skills"


class Journal:
    """One append-only JSONL file; ``episode`` tags what this episode writes."""

    def __init__(self, path: str | Path, *, episode: str = "0"):
        self.path = Path(path)
        self.episode = episode
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, kind: str, text: str, *, author: str = "agent", job: int | None = None,
              **fields: str) -> dict[str, Any]:
        """Append one entry; raises ``ValueError`` (with what to fix) on a bad kind or a plan missing fields."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
        if not str(text).strip():
            raise ValueError("text is empty; write what you plan, saw or learned")
        if kind == "plan":
            missing = [f for f in PLAN_FIELDS if not str(fields.get(f) or "").strip()]
            if missing:
                raise ValueError(f"a plan needs {', '.join(PLAN_FIELDS)}; missing: {', '.join(missing)}")
        extra = {k: str(v)[:MAX_TEXT] for k, v in fields.items() if v not in (None, "")}
        entry = {"time": round(time.time(), 3), "episode": self.episode, "author": author, "job": job,
                 "kind": kind, "text": str(text)[:MAX_TEXT], **extra}
        line = (json.dumps(entry, ensure_ascii=False) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        return entry

    def entries(self) -> list[dict[str, Any]]:
        """Every entry, oldest first (a torn last line is skipped)."""
        if not self.path.is_file():
            return []
        out = []
        for ln in self.path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(ln))
            except ValueError:
                continue
        return out

    def read(self, kind: str | None = None, last: int = 10) -> list[dict[str, Any]]:
        """The ``last`` entries (of one ``kind`` when given), oldest first."""
        rows = [e for e in self.entries() if kind in (None, "", e.get("kind"))]
        return rows[-max(1, last):]


def format_entry(e: dict[str, Any]) -> str:
    """One entry as the agent reads it."""
    head = f"[{e.get('kind')}] ep {e.get('episode')}" + (f" job {e['job']}" if e.get("job") is not None else "")
    head += f" ({e['author']})" if e.get("author") not in (None, "agent") else ""
    rest = "; ".join(f"{k}: {e[k]}" for k in PLAN_FIELDS if e.get(k))
    return f"{head}: {e.get('text')}" + (f" | {rest}" if rest else "")


class SkillLibrary:
    """A folder of short markdown skills; the name of a skill is its file name without ``.md``."""

    def __init__(self, folder: str | Path | None = None):
        self.folder = Path(folder) if folder else SKILLS_DIR

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.folder.glob("*.md"))

    def title(self, name: str) -> str:
        first = self.read(name).splitlines()[0] if self.read(name) else name
        return first.lstrip("# ").strip()

    def read(self, name: str) -> str:
        """The skill's text; ``KeyError`` listing the known names when there is none."""
        name = str(name).removesuffix(".md")
        if name not in self.names():
            raise KeyError(f"no skill {name!r}; skills: {', '.join(self.names())}")
        return (self.folder / f"{name}.md").read_text(encoding="utf-8")


# --- the tools ------------------------------------------------------------------------------

_TEXT = {"type": "string"}
SCHEMAS = {
    "journal_write": tool_schema(
        "journal_write", "Append an entry to your experiment journal (kept across episodes when configured).",
        {"kind": {"type": "string", "description": "plan | observation | lesson | eval_result | eval_analysis"},
         "text": {"type": "string", "description": "the entry"},
         "hypothesis": {"type": "string", "description": "plan: what you expect and why"},
         "success_criteria": {"type": "string", "description": "plan: what result counts as success"},
         "abort_criteria": {"type": "string", "description": "plan: what result makes you stop this line"}},
        ["kind", "text"]),
    "journal_read": tool_schema(
        "journal_read", "Read the last entries of your experiment journal.",
        {"kind": {"type": "string", "description": "only this kind; default: all"},
         "last": {"type": "integer", "description": "how many entries; default 10"}}, []),
    "list_skills": tool_schema("list_skills", "List the skill library: short notes on what works.", {}, []),
    "read_skill": tool_schema("read_skill", "Read one skill of the library.",
                              {"name": {"type": "string", "description": "a name from list_skills"}}, ["name"]),
}


def journal_tools(journal: Journal, jobs_done=lambda: None) -> list[tuple[dict[str, Any], Any]]:
    """``(schema, impl)`` pairs of journal_write and journal_read bound to ``journal``."""

    def write(kind: str, text: str, hypothesis: str = "", success_criteria: str = "",
              abort_criteria: str = "") -> ToolResult:
        try:
            e = journal.write(kind, text, job=jobs_done(), hypothesis=hypothesis, success_criteria=success_criteria,
                              abort_criteria=abort_criteria)
        except ValueError as err:
            return ToolResult(f"journal_write: {err}", ok=False)
        return ToolResult(f"journal: {kind} entry appended ({len(journal.entries())} entries)", data=e)

    def read(kind: str = "", last: int = 10) -> ToolResult:
        if kind and kind not in KINDS:
            return ToolResult(f"journal_read: kind must be one of {', '.join(KINDS)}", ok=False)
        rows = journal.read(kind or None, last)
        return ToolResult("\n".join(format_entry(e) for e in rows) if rows else "(the journal is empty)",
                          data={"entries": len(rows)})

    return [(SCHEMAS["journal_write"], write), (SCHEMAS["journal_read"], read)]


def skill_tools(library: SkillLibrary) -> list[tuple[dict[str, Any], Any]]:
    """``(schema, impl)`` pairs of list_skills and read_skill bound to ``library``."""

    def list_skills() -> ToolResult:
        names = library.names()
        return ToolResult("\n".join(f"{n}: {library.title(n)}" for n in names) or "(no skills)",
                          data={"skills": names})

    def read_skill(name: str) -> ToolResult:
        try:
            return ToolResult(library.read(name), data={"name": name})
        except KeyError as err:
            return ToolResult(str(err.args[0]), ok=False)

    return [(SCHEMAS["list_skills"], list_skills), (SCHEMAS["read_skill"], read_skill)]
