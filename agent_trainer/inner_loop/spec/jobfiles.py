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
import stat
import sys
import tempfile
from pathlib import Path, PurePosixPath

MAX_JOB_YAML_BYTES = 64 * 1024
MAX_REWARD_FILE_BYTES = 256 * 1024
MAX_ENTRIES = 1000  # files and folders in a job folder
# A data row: every string value (prompt included: MAX_PROMPT_CHARS in agent_trainer.inner_loop.train.data) at most
# MAX_FIELD_CHARS characters, at most MAX_COLUMNS columns with names of at most MAX_KEY_CHARS. These bound the
# harness's work per row (folding for the contamination check, tokenizing) whatever the file's size.
MAX_FIELD_CHARS = 4000
MAX_COLUMNS = 32
MAX_KEY_CHARS = 64
MAX_SNAPSHOT_BYTES = 128 * 2**20  # all files of a job folder together (its snapshot, ``snapshot_job``)
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


class SnapshotError(ValueError):
    """A job folder that cannot be snapshotted (over ``MAX_SNAPSHOT_BYTES`` or ``MAX_ENTRIES``); the message says so."""


def snapshot_job(job_dir: str | Path, skip: list[str | Path] = ()) -> Path:
    """A read-only copy of the job folder in a fresh folder of the harness (modes 0555/0444): what a job is
    validated, checked and trained from, so a writer that changes the folder afterwards changes nothing.

    Plain files are copied (each opened once, without following links); a symbolic link is copied as a
    link, never followed, so the validation still refuses it; ``skip``: folders the harness writes
    inside the job folder (its default ``<job>/output``). Raises ``SnapshotError`` past the caps and
    ``FileNotFoundError`` when ``job_dir`` is no folder."""
    root = Path(job_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"job folder {root} does not exist")
    skipped = {Path(s).resolve() for s in skip}
    dest = Path(tempfile.mkdtemp(prefix="at-job-")) / (root.resolve().name or "job")  # the folder's own name
    dest.mkdir()
    try:
        _copy_tree(root, dest, skipped)
    except BaseException:
        remove_snapshot(dest)
        raise
    os.chmod(dest.parent, 0o555)
    return dest


def _copy_tree(root: Path, dest: Path, skipped: set[Path]) -> None:
    total, seen = 0, 0
    for here, dirs, files in os.walk(root, followlinks=False):
        rel_here = Path(here).relative_to(root)
        dirs[:] = sorted(d for d in dirs if (Path(here) / d).is_symlink() or (Path(here) / d).resolve() not in skipped)
        for name in [*dirs, *sorted(files)]:
            seen += 1
            if seen > MAX_ENTRIES:
                raise SnapshotError(f"the job folder holds more than {MAX_ENTRIES} files and folders")
            src, out = Path(here) / name, dest / rel_here / name
            if src.is_symlink():
                os.symlink(os.readlink(src), out)
            elif name in dirs:
                out.mkdir()
            else:
                total += _copy_file(src, out, MAX_SNAPSHOT_BYTES - total)
        dirs[:] = [d for d in dirs if not (Path(here) / d).is_symlink()]
    for here, dirs, files in os.walk(dest, topdown=False):
        for name in files:
            if not (Path(here) / name).is_symlink():
                os.chmod(Path(here) / name, 0o444)
        os.chmod(here, 0o555)  # readable by a sandbox's own uid, writable by no one but root


def _copy_file(src: Path, out: Path, room: int) -> int:
    fd = os.open(src, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return 0  # a pipe or device: not copied (the validation reports the file as missing)
        with os.fdopen(fd, "rb", closefd=False) as f, open(out, "wb") as w:
            copied = 0
            while chunk := f.read(1 << 20):
                copied += len(chunk)
                if copied > room:
                    raise SnapshotError(f"the job folder holds more than {MAX_SNAPSHOT_BYTES // 2**20} MB of files")
                w.write(chunk)
        return copied
    finally:
        os.close(fd)


def remove_snapshot(path: str | Path) -> None:
    """Delete a snapshot made by ``snapshot_job`` (its read-only modes first)."""
    import shutil

    top = Path(path).parent
    if not top.name.startswith("at-job-") or not top.is_dir():
        return
    os.chmod(top, 0o700)
    for here, dirs, _ in os.walk(top):
        os.chmod(here, 0o700)
    shutil.rmtree(top, ignore_errors=True)
