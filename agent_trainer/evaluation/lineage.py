"""Lineage check: is a checkpoint a trained copy of its declared base model (no model substitution)?

    lineage_mismatch("job/output/model", "~/.cache/agent-trainer/models/tiny-s-seed0-v2")   # None = fine

Compares files (safetensors only, no code, no links), ``config.json``, parameter names and shapes,
tokenizer and generation config with the base model's, reading headers and JSON only (no weights
loaded, no code run). The rules and what they miss: docs/security.md, "Lineage rules".
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".npy", ".npz")
CODE_SUFFIXES = (".py", ".pyc", ".so")
IGNORED_CONFIG = {"use_cache", "transformers_version", "_name_or_path", "dtype", "torch_dtype"}
IGNORED_TOKENIZER_CONFIG = {"is_local", "local_files_only", "name_or_path", "_commit_hash", "tokenizer_file"}
IGNORED_GENERATION = {"transformers_version", "_from_model_config"}
MAX_HEADER_BYTES = 100 * 2**20


class LineageError(ValueError):
    """A checkpoint that is not a trained copy of its base model; the message says what differs."""


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LineageError(f"no {path.name} in the {what}") from None
    except (OSError, ValueError) as e:
        raise LineageError(f"cannot read {path.name} of the {what}: {e}") from None
    if not isinstance(data, dict):
        raise LineageError(f"{path.name} of the {what} is not a JSON object")
    return data


def safetensors_shapes(folder: str | Path) -> dict[str, list[int]]:
    """``{tensor name: shape}`` over every ``*.safetensors`` file in ``folder``, from the headers only."""
    shapes: dict[str, list[int]] = {}
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise LineageError("no safetensors weights")
    for path in files:
        try:
            with open(path, "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                if size > MAX_HEADER_BYTES:
                    raise LineageError(f"{path.name} has a {size}-byte header; not a safetensors file")
                header = json.loads(f.read(size))
        except (OSError, ValueError, struct.error) as e:
            raise LineageError(f"{path.name} is not a readable safetensors file: {e}") from None
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if name in shapes:
                raise LineageError(f"tensor {name!r} is stored twice")
            shapes[name] = list(info.get("shape", [])) if isinstance(info, dict) else []
    return shapes


def _check_files(checkpoint: Path) -> None:
    if not checkpoint.is_dir() or checkpoint.is_symlink():
        raise LineageError("the checkpoint is not a plain folder")
    for p in sorted(checkpoint.iterdir()):
        if p.is_symlink():
            raise LineageError(f"{p.name} is a symbolic link; a checkpoint holds plain files only")
        if p.is_dir():
            continue
        name = p.name.lower()
        if name.endswith(PICKLE_SUFFIXES):
            raise LineageError(f"pickled weight file {p.name}; the harness loads safetensors only")
        if name.endswith(CODE_SUFFIXES):
            raise LineageError(f"code file {p.name} in the checkpoint; the harness runs no checkpoint code")
        if os.stat(p, follow_symlinks=False).st_nlink > 1:
            raise LineageError(f"{p.name} is a hard link to a file elsewhere; a checkpoint holds its own files")


def _same(key: str, a, b) -> bool:
    """Equal; for a ``*_token_id`` key a one-element list counts as its element: transformers 5.10 saves
    ``eos_token_id: [2]`` where 5.24 saves ``2`` (the same token to stop at)."""
    return a == b or (key.endswith("_token_id") and _unwrap(a) == _unwrap(b))


def _unwrap(v):
    return v[0] if isinstance(v, list) and len(v) == 1 else v


def _diff(got: dict, want: dict, ignored: set[str], what: str) -> None:
    for key in sorted((set(got) | set(want)) - ignored):
        if not _same(key, got.get(key), want.get(key)):
            g, w = json.dumps(got.get(key))[:80], json.dumps(want.get(key))[:80]
            raise LineageError(f"{what} {key} is {g}, the base model has {w}")


def check_lineage(checkpoint: str | Path, base: str | Path) -> None:
    """Raise ``LineageError`` unless ``checkpoint`` has the base model's architecture, shapes and tokenizer."""
    checkpoint, base = Path(checkpoint), Path(base)
    _check_files(checkpoint)
    _diff(_read_json(checkpoint / "config.json", "checkpoint"), _read_json(base / "config.json", "base model"),
          IGNORED_CONFIG, "config")
    got, want = safetensors_shapes(checkpoint), safetensors_shapes(base)
    if set(got) != set(want):
        extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
        raise LineageError(f"parameters differ from the base model's: extra {extra[:3]}, missing {missing[:3]}")
    for name in sorted(want):
        if got[name] != want[name]:
            raise LineageError(f"parameter {name} has shape {got[name]}, the base model has {want[name]}")
    if (base / "tokenizer.json").is_file():
        if _read_json(checkpoint / "tokenizer.json", "checkpoint") != _read_json(base / "tokenizer.json", "base model"):
            raise LineageError("tokenizer.json differs from the base model's (another tokenizer)")
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (base / name).is_file() or (checkpoint / name).is_file():
            _diff(_read_json(checkpoint / name, "checkpoint"), _read_json(base / name, "base model"),
                  IGNORED_TOKENIZER_CONFIG, name)
    if (base / "generation_config.json").is_file() or (checkpoint / "generation_config.json").is_file():
        _diff(_read_json(checkpoint / "generation_config.json", "checkpoint"),
              _read_json(base / "generation_config.json", "base model"), IGNORED_GENERATION, "generation_config")


def lineage_mismatch(checkpoint: str | Path, base: str | Path) -> str | None:
    """Why ``checkpoint`` is not a trained copy of ``base`` (one line), or None when it is."""
    try:
        check_lineage(checkpoint, base)
    except LineageError as e:
        return str(e)
    return None
