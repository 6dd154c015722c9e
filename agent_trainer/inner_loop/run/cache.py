"""Job cache: a job whose content was already run returns its stored result instead of training again.

    r = run_job(job_dir, task, cache=True)      # a hit: r.cached, r.cached_from (the run that trained it)
    r = through_cache(Job.open(request), execute)   # what run_request does with settings.cache
                                                    # (agent_trainer.inner_loop.run.job)

``cache_key`` hashes everything that decides a job's numbers (its files, task, base model, seed,
libraries, the kind of CPU, harness source, settings that change an outcome). Only ``ok`` and ``diverged`` results are
stored, in ``<cache root>/jobs/``, pointing at the original run's weights. The key, the entries and
what a hit costs: docs/inner_loop.md, "Job cache".
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Callable

from agent_trainer.paths import PROJECT_ROOT
from agent_trainer.paths import cache_dir as default_cache_dir
from agent_trainer.kernels import cpu_kind
from agent_trainer.inner_loop.run.result import (
    RESULT_FILE, JobResult, job_hash, library_versions, track_result, write_json_atomic,
)

CACHE_SUBDIR = "jobs"
ENTRY_FILE = "entry.json"
CACHED_FROM_FILE = "cached_from.json"
FORMAT = 1                                   # bump when the entry layout changes
CACHEABLE = ("ok", "diverged")               # outcomes a rerun reproduces (see module doc)
COPIED_FILES = ("train_log.jsonl", "trl_config.json")
_TOKENIZER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")
_HARNESS_PACKAGES = ("agent_trainer/inner_loop", "agent_trainer/evaluation")
_model_digests: dict[tuple, str] = {}
_harness_digest: str | None = None


def harness_digest() -> str:
    """sha256 of the harness source (``inner_loop``, ``evaluation``): the harness version of the key."""
    global _harness_digest
    if _harness_digest is None:
        h = hashlib.sha256(f"format{FORMAT}".encode())
        for pkg in _HARNESS_PACKAGES:
            for p in sorted((PROJECT_ROOT / pkg).rglob("*.py")):
                h.update(str(p.relative_to(PROJECT_ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
        _harness_digest = h.hexdigest()
    return _harness_digest


def model_digest(model_dir: str | Path) -> str:
    """sha256 of a base model's weights, config and tokenizer (memoised per path, size and mtime)."""
    from agent_trainer.evaluation.hidden_eval import checkpoint_hash

    model_dir = Path(model_dir).resolve()
    stamp = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(model_dir.iterdir()) if p.is_file())
    key = (str(model_dir), stamp)
    if key not in _model_digests:
        h = hashlib.sha256(checkpoint_hash(model_dir).encode())
        for name in _TOKENIZER_FILES:
            p = model_dir / name
            h.update(name.encode() + b"\0" + (p.read_bytes() if p.is_file() else b"<missing>") + b"\0")
        _model_digests[key] = h.hexdigest()
    return _model_digests[key]


def folder_digest(folder: str | Path, exclude: list[Path] = ()) -> str:
    """sha256 of every regular file under ``folder`` (names and contents), skipping ``exclude`` and links."""
    folder = Path(folder).resolve()
    skip = [Path(e).resolve() for e in exclude]
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_symlink() or not p.is_file() or any(p == s or s in p.parents for s in skip):
            continue
        if "__pycache__" in p.parts:
            continue
        h.update(str(p.relative_to(folder)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return value


def key_parts(job) -> dict[str, Any]:
    """Everything the key hashes, readable (stored in the entry), for a ``Job`` whose spec was parsed."""
    from agent_trainer.inner_loop.models import resolve_model
    from agent_trainer.salt import hidden_salt

    r, spec = job.request, job.spec
    salt = hidden_salt().label   # the hidden set scored and checked against (the default's keys are kept)
    s = r.settings
    base = Path(s.model_dir) if s.model_dir else Path(resolve_model(spec.base_model, cache_dir=s.cache_dir))
    return {
        "format": FORMAT,
        "job_hash": job_hash(r.job_dir, spec),
        "job_folder": folder_digest(r.job_dir, exclude=[r.out, r.job_dir / "output"]),  # outputs are never content
        "task": _plain(r.task),
        "hidden_n": int(r.hidden_n),
        "base_model": spec.base_model,
        "base_model_digest": model_digest(base),
        "seed": spec.seed,
        "libraries": library_versions(),
        "cpu": cpu_kind(),   # a shared cache on a cluster of several CPU kinds: their numbers differ in the last digits
        "harness": harness_digest(),
        "settings": {k: _plain(v) for k, v in sorted(outcome_settings(job).items())},
        **({"hidden_salt": salt} if salt != "public" else {}),
    }


def cache_key(parts: dict[str, Any]) -> str:
    """The sha256 of ``key_parts`` (canonical JSON)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class JobCache:
    """Entries under ``<cache root>/jobs`` (see the module docstring)."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else default_cache_dir() / CACHE_SUBDIR
        self.root.mkdir(parents=True, exist_ok=True)

    @classmethod
    def under(cls, cache_dir: str | Path | None = None) -> "JobCache":
        """The job cache of a cache root (``agent_trainer.paths.cache_dir``)."""
        return cls(default_cache_dir(cache_dir) / CACHE_SUBDIR)

    def entry_dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    @contextmanager
    def locked(self, key: str):
        """Hold ``key``'s file lock: an identical job running meanwhile waits, then finds the entry."""
        from agent_trainer.inner_loop.models.registry import file_lock

        with file_lock(self.root / key[:2] / f".{key}.lock"):
            yield

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored entry, or None: a damaged entry, or one whose weights are gone, counts as absent."""
        try:
            entry = json.loads((self.entry_dir(key) / ENTRY_FILE).read_text())
        except (OSError, ValueError):
            return None
        if entry.get("format") != FORMAT or not isinstance(entry.get("result"), dict):
            return None
        model = entry.get("model_dir")
        if model and not (Path(model) / "config.json").is_file():
            return None
        return entry

    def put(self, key: str, result, parts: dict[str, Any]) -> bool:
        """Store a finished job's result (only ``CACHEABLE`` outcomes); True when stored."""
        if result.status not in CACHEABLE:
            return False
        final = self.entry_dir(key)
        tmp = final.with_name(f".{key}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        out = Path(result.output_dir)
        for name in COPIED_FILES:
            if (out / name).is_file():
                shutil.copy2(out / name, tmp / name)
        model = out / "model"
        entry = {"format": FORMAT, "key": key, "created": time.time(), "output_dir": str(out.resolve()),
                 "model_dir": str(model.resolve()) if model.is_dir() else None,
                 "result": {**result.as_dict(), "cached": False}, "key_parts": parts}
        (tmp / ENTRY_FILE).write_text(json.dumps(entry, indent=1, default=str) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        return True

    def restore(self, key: str, entry: dict[str, Any], job_dir: str | Path, output_dir: Path, t_start: float,
                price_per_hour: float):
        """The cached ``JobResult`` for this request, with ``result.json`` and the log copies in ``output_dir``."""
        output_dir.mkdir(parents=True, exist_ok=True)
        for name in COPIED_FILES:
            src = self.entry_dir(key) / name
            if src.is_file():
                shutil.copy2(src, output_dir / name)
        known = {f.name for f in fields(JobResult)}
        res = JobResult(**{k: v for k, v in entry["result"].items() if k in known})
        res.job_dir, res.output_dir = str(job_dir), str(output_dir)
        res.cached, res.cache_key, res.cached_from = True, key, entry.get("output_dir")
        original = dict(res.seconds)
        res.seconds["total"] = round(time.monotonic() - t_start, 4)
        res.usd = round(res.seconds["total"] / 3600 * price_per_hour, 8)
        model = entry.get("model_dir")
        (output_dir / CACHED_FROM_FILE).write_text(json.dumps({
            "key": key, "output_dir": entry.get("output_dir"), "model_dir": model,
            "model_exists": bool(model) and Path(model).is_dir(), "original_seconds": original,
            "original_usd": entry["result"].get("usd"), "created": entry.get("created")}, indent=2) + "\n")
        write_json_atomic(output_dir / RESULT_FILE, res.as_dict())
        return res


def through_cache(job, execute: Callable[[Any], Any]):
    """``execute(job)`` behind the job cache: the stored result of an identical job, else a run that is stored.

    A job without a parsed spec, or whose base model cannot be resolved, runs uncached: its validation
    then reports what is wrong."""
    if job.spec is None:
        return execute(job)
    try:
        parts = key_parts(job)
    except Exception:  # the job's fault (unknown base model, ...): the validation names it
        return execute(job)
    r = job.request
    key = cache_key(parts)
    cache = JobCache.under(r.settings.cache_dir)
    with cache.locked(key):
        entry = cache.get(key)
        if entry is not None:
            res = cache.restore(key, entry, job.source_dir or r.job_dir, r.out, job.t_start, job.price_per_hour)
            if r.settings.tracker is not None:
                r.settings.tracker.log_params({"job.cached": True, "job.cache_key": key})
                track_result(r.settings.tracker, res, r.out, [])
            return res
        res = execute(job)
        res.cache_key = key
        write_json_atomic(r.out / RESULT_FILE, res.as_dict())
        cache.put(key, res, parts)
    return res


def outcome_settings(job) -> dict[str, Any]:
    """The settings of a ``Job`` that can change its outcome (the ``settings`` part of the key)."""
    s = job.request.settings
    return {"dry_run": s.dry_run, "cost_model": job.cost_model, "price_per_hour": job.price_per_hour,
            "timeout_s": s.timeout_s, "sandboxed": s.wrap is not None, "sandbox": s.sandbox,
            "device": _device_of(s.device), "vllm": bool(s.vllm)}


def _device_of(device: str) -> str:
    """The device a job will train on (``auto`` resolved as the job's process will): GPU numbers are
    not CPU numbers, so the device is part of the key. ``cuda`` stays ``cuda`` even where this process
    sees no GPU (a SLURM or Ray job gets its GPU on its node)."""
    from agent_trainer.inner_loop.train.config import resolve_device

    return resolve_device(device) if device == "auto" else device


def cache_counts(results) -> dict[str, int]:
    """Hits and misses among job results (a miss: looked up, not found; jobs run uncached count as neither)."""
    hits = sum(1 for r in results if getattr(r, "cached", False))
    looked_up = sum(1 for r in results if getattr(r, "cache_key", None))
    return {"hits": hits, "misses": looked_up - hits}


__all__ = ["JobCache", "through_cache", "key_parts", "cache_key", "cache_counts", "harness_digest", "model_digest",
           "folder_digest", "CACHEABLE"]
