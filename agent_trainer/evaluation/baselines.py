"""Baseline cache: the hidden-eval score of an untrained base model, computed once per (model, family).

    >>> from agent_trainer.evaluation.baselines import get_baseline, lookup_baseline, baseline_table
    >>> get_baseline(path, "calc_chain")        # scores on first use, then reads the cache
    >>> lookup_baseline(path, "calc_chain")     # None when not computed yet (never computes)
    >>> print(baseline_table({"tiny-s": p_s, "tiny-m": p_m}).markdown)

Entries live in ``<cache>/baselines.json`` keyed by ``<model sha256>/<family>/v<version>/n<n>`` (plus
``/split-<split>`` for a family whose split is not the prompt hash, ``TaskFamily.split``, and ``/salt-<label>`` for
a hidden set drawn with a salt other than the default public one, ``agent_trainer.salt``): a rebuilt model (new
weights), a new family version or another hidden set gets a new entry, never a stale one. Writes
are atomic (temp file + rename) under an ``fcntl`` lock, so parallel jobs can share the file.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from agent_trainer.paths import cache_dir as default_cache_dir
from agent_trainer.evaluation.families import family_names, get_family
from agent_trainer.evaluation.hidden_eval import checkpoint_hash, score_checkpoint
from agent_trainer.salt import hidden_salt
from agent_trainer.evaluation.prompts import RAW, PromptFormat, for_family

BASELINES_FILE = "baselines.json"


def _key(model_path, family: str, n: int, fmt: PromptFormat = RAW) -> str:
    fam = get_family(family)
    key = f"{checkpoint_hash(model_path)}/{fam.name}/v{fam.version}/n{n}"
    key += f"/split-{fam.split}" if fam.split else ""
    salt = hidden_salt().label  # a baseline per hidden set: the default public salt keeps the keys it always had
    key = key if salt == "public" else f"{key}/salt-{salt}"
    return key if fmt.kind == "raw" else f"{key}/{fmt.key}"


@contextmanager
def _locked(cache: Path):
    with open(cache / f".{BASELINES_FILE}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read(cache: Path) -> dict:
    path = cache / BASELINES_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        # A damaged cache is only a cache: start again rather than fail every job.
        return {}


def _write(cache: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{BASELINES_FILE}.", dir=cache)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, cache / BASELINES_FILE)


def lookup_baseline(model_path, family: str, n: int = 200, cache_dir=None, fmt: PromptFormat = RAW) -> float | None:
    """The cached baseline (in prompt format ``fmt``), or None when it has not been computed (never computes)."""
    entry = _read(default_cache_dir(cache_dir)).get(_key(model_path, family, n, fmt))
    return None if entry is None else float(entry["score"])


def get_baseline(model_path, family: str, n: int = 200, cache_dir=None, device: str = "cpu",
                 fmt: PromptFormat = RAW) -> float:
    """The hidden-eval score of ``model_path`` on ``family`` in prompt format ``fmt``: from the cache, else
    computed (on ``device``: greedy decoding in fp32, so the device does not enter the key) and stored."""
    cache = default_cache_dir(cache_dir)
    key = _key(model_path, family, n, fmt)
    # Holding the lock while scoring means two processes never score the same key twice.
    with _locked(cache):
        data = _read(cache)
        if key in data:
            return float(data[key]["score"])
        result = score_checkpoint(model_path, family, n=n, device=device, fmt=fmt)
        data = _read(cache)
        data[key] = {"score": result.score, "seconds": result.seconds, "model": str(model_path),
                     "computed_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        _write(cache, data)
    return result.score


@dataclass
class BaselineTable:
    """Baselines of several models on several families."""

    n: int
    scores: dict[str, dict[str, float]] = field(default_factory=dict)  # model -> family -> score

    @property
    def markdown(self) -> str:
        models = list(self.scores)
        families = sorted({f for per in self.scores.values() for f in per})
        lines = ["| family | " + " | ".join(models) + " |", "|---|" + "---:|" * len(models)]
        for fam in families:
            lines.append(f"| {fam} | " + " | ".join(f"{self.scores[m][fam]:.3f}" for m in models) + " |")
        return "\n".join(lines)


def baseline_table(models: dict[str, str | os.PathLike], families: list[str] | None = None, n: int = 200,
                   cache_dir=None, kind: str = "raw") -> BaselineTable:
    """Baselines (cached) of each named model folder on each family (default: all families), in prompt
    format ``kind`` (chat: each family's instruction as the system prompt,
    ``agent_trainer.evaluation.prompts.for_family``)."""
    table = BaselineTable(n=n)
    for name, path in models.items():
        table.scores[name] = {f: get_baseline(path, f, n=n, cache_dir=cache_dir, fmt=for_family(f, kind))
                              for f in families or family_names()}
    return table
