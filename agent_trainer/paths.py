"""Where things live on disk: the model/baseline cache and the project root."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """The cache folder: ``override``, else ``$AGENT_TRAINER_CACHE``, else ``~/.cache/agent-trainer``."""
    if override:
        path = Path(override).expanduser()
    elif os.environ.get("AGENT_TRAINER_CACHE"):
        path = Path(os.environ["AGENT_TRAINER_CACHE"]).expanduser()
    else:
        path = Path.home() / ".cache" / "agent-trainer"
    path.mkdir(parents=True, exist_ok=True)
    return path


def resolve_path(path: str | os.PathLike) -> Path:
    """A user-given path: as given if it exists, else relative to the project root if that exists."""
    p = Path(path).expanduser()
    if p.exists() or p.is_absolute():
        return p
    q = PROJECT_ROOT / p
    return q if q.exists() else p
