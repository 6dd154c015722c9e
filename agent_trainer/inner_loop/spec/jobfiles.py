"""What a job folder may hold: plain data files and its declared reward files, nothing that acts as code.

    code_name_problem("resource.py")           # why the name could run as code, or None
    job_folder_problems(job_dir, reward_files=["reward.py"])   # [(relative path, problem)]

Refuses code-like names, folders named like importable modules and links, and holds the size caps of
agent files; the validation and the agent's ``write_file`` use it. The rules: docs/security.md.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path, PurePosixPath

MAX_JOB_YAML_BYTES = 64 * 1024
MAX_REWARD_FILE_BYTES = 256 * 1024
MAX_ENTRIES = 1000  # files and folders in a job folder
REWARD_FILE = re.compile(r"^reward[A-Za-z0-9_]*\.py$")
CODE_SUFFIXES = (".py", ".pyw", ".pyc", ".pyo", ".pyd", ".pyi", ".so", ".pth", ".zip", ".egg", ".whl", ".pyz",
                 ".pyzw", ".egg-link", ".dylib", ".dll")
CODE_FOLDERS = ("__pycache__",)
CODE_FOLDER_SUFFIXES = (".dist-info", ".egg-info", ".egg")
PROJECT_PACKAGES = ("agent_trainer", "evaluation", "inner_loop", "outer_loop", "scripts")


@functools.lru_cache(maxsize=1)
def module_names() -> frozenset[str]:
    """Top-level module names the harness's interpreter can import (stdlib, installed, the project's)."""
    from importlib.metadata import packages_distributions

    return frozenset({*sys.stdlib_module_names, *sys.builtin_module_names, *packages_distributions(),
                      *PROJECT_PACKAGES})


def _folder_problem(name: str) -> str | None:
    low = name.lower()
    if low in CODE_FOLDERS or low.endswith(CODE_FOLDER_SUFFIXES):
        return f"a {name} folder holds Python bytecode or package metadata"
    if name in module_names():
        return f"a folder named {name!r} would act as the Python package {name!r}"
    return None


def _file_problem(name: str) -> str | None:
    if name.lower().endswith(CODE_SUFFIXES) and not REWARD_FILE.match(name):
        return f"{name!r} is a file Python can import or execute; only reward files named reward*.py may hold code"
    return None


def code_name_problem(path: str) -> str | None:
    """Why the relative file path ``path`` could act as code (its name or a folder on the way), or None."""
    parts = PurePosixPath(path).parts
    for folder in parts[:-1]:
        why = _folder_problem(folder)
        if why:
            return why
    return _file_problem(parts[-1]) if parts else None


def job_folder_problems(job_dir: str | Path, reward_files: list[str] = (),
                        skip: list[str | Path] = ()) -> list[tuple[str, str]]:
    """``(relative path, problem)`` for every entry of the job folder that could act as code or is a link.

    ``reward_files``: the job's declared reward files (the only Python allowed); ``skip``: folders
    the harness itself writes inside the job folder (``run_job``'s default ``<job>/output``)."""
    root = Path(job_dir)
    skipped = {Path(s).resolve() for s in skip}
    allowed = set(reward_files)
    out: list[tuple[str, str]] = []
    seen = 0
    for here, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if (Path(here) / d).resolve() not in skipped)
        for name in [*dirs, *sorted(files)]:
            seen += 1
            if seen > MAX_ENTRIES:
                return out + [(".", f"the job folder holds more than {MAX_ENTRIES} files and folders")]
            path = Path(here) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                why = f"{rel} is a symbolic link; the job folder must hold plain files"
            elif name in dirs:
                why = _folder_problem(name)
            else:
                why = None if rel in allowed else _file_problem(name)
                if why is None and name.lower().endswith(".py") and rel not in allowed:
                    why = f"{rel!r} is Python code the job does not declare as its reward file"
            if why:
                out.append((rel, why))
        dirs[:] = [d for d in dirs if not (Path(here) / d).is_symlink()]
    return out


def job_file_problems(job_dir: str | Path, names: list[str]) -> list[tuple[str, str]]:
    """``(file, problem)`` for declared job files that are links or lead outside the job folder.

    The harness reads these files itself (validation, contamination check, hashing), outside any
    sandbox: a ``data.jsonl`` linked to a harness file would be read, and quoted in findings."""
    root = Path(job_dir).resolve()
    out = []
    for name in dict.fromkeys(names):
        p = Path(job_dir) / name
        if p.is_symlink():
            out.append((name, f"{name} is a symbolic link; the job folder must hold the file itself"))
        elif p.exists() and root not in p.resolve().parents:
            out.append((name, f"{name} leads outside the job folder; the job folder must hold the file itself"))
    return out


def oversized(path: str | Path, limit: int) -> str | None:
    """Why the file at ``path`` is too large to parse (checked before it is read), or None."""
    try:
        size = Path(path).stat().st_size
    except OSError:
        return None
    if size > limit:
        return f"{Path(path).name} is {size:,} bytes; the limit is {limit:,}"
    return None
