"""Base models by name: the tiny models this project ships, and real Qwen3 models from a local folder.

    from agent_trainer.inner_loop.models import resolve_model, load_model, load_tokenizer
    path = resolve_model("tiny-s")          # the package's files, their sha256s checked against SHA256SUMS.json
    model, tok = load_model(path), load_tokenizer(path)

tiny-s, tiny-m and the tiny agent (seed 0) ship with the package as files (``shipped/``, a few MB): the same
bytes on every machine, whatever its CPU (a build's float kernels differ between CPUs). Other seeds, and a
model whose build version is newer than its shipped files, are built into the cache as before.

Nothing is downloaded. The cache layout, where Qwen3 folders go, ``base_models`` entries and
``register_builder``: docs/inner_loop.md, "Base models".
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from agent_trainer.config import BaseModelEntry
from agent_trainer.paths import cache_dir as default_cache_dir
from agent_trainer.registry import BASE_MODELS_ENV, Registry
from agent_trainer.inner_loop.run.job_env import usable_cores
from agent_trainer.inner_loop.models.build import (
    BUILD_VERSION, MANIFEST, TINY_M, TINY_S, ModelBuildConfig, build_model, file_sha256,
)


class ModelError(Exception):
    """A model request the registry cannot serve; the message says what to do."""


class ModelNotFoundError(ModelError, FileNotFoundError):
    """A base model that is not known or not on disk; the message says where to put it."""


@dataclass(frozen=True)
class BaseModel:
    """A base model an inner job may start from."""

    name: str
    kind: str  # "built": made by this project; "imported": converted from a wheel's GGUF; "local": a folder
    stands_for: str = BaseModelEntry.stands_for
    hf_folder: str = ""
    build: ModelBuildConfig | None = None
    path: str | None = None  # "local": this folder (from configuration) instead of the hf/ search
    dtype: str = BaseModelEntry.dtype.value  # how the harness loads it (evaluation, the dry run)
    cost_factor: float | None = None  # seconds per step relative to tiny-s on this machine
                                      # (agent_trainer.inner_loop.spec.cost)


BASE_MODELS: Registry[BaseModel] = Registry("base model", error=ModelNotFoundError,
                                            hint="add one with base_models.<name>.path=<folder>")
for _m in (BaseModel("tiny-s", "built", stands_for="Qwen3-0.6B", build=TINY_S),
           BaseModel("tiny-m", "built", stands_for="Qwen3-1.7B", build=TINY_M),
           BaseModel("smollm2-135m", "imported", stands_for="SmolLM2-135M-Instruct"),
           BaseModel("qwen3-0.6b", "local", hf_folder="Qwen3-0.6B"),
           BaseModel("qwen3-1.7b", "local", hf_folder="Qwen3-1.7B")):
    BASE_MODELS.register(_m.name, _m)
BUILT_IN_MODELS = frozenset(BASE_MODELS)
_CONFIGURED: list[str] = []


def _load_configured(registry: Registry, entries: str) -> None:
    """Base models from configuration (``AGENT_TRAINER_BASE_MODELS``: JSON name -> entry)."""
    for name in _CONFIGURED:
        registry.unregister(name)
    _CONFIGURED.clear()
    for name, entry in (json.loads(entries) if entries else {}).items():
        if name in BUILT_IN_MODELS:
            raise ModelError(f"base_models.{name}: {name!r} is a built-in model; pick another name")
        registry.register(name, BaseModel(name, "local", stands_for=str(entry.get("stands_for") or ""),
                                          path=str(entry["path"]), dtype=str(entry.get("dtype") or "float32"),
                                          cost_factor=entry.get("cost_factor")))
        _CONFIGURED.append(name)


BASE_MODELS.add_loader(lambda: os.environ.get(BASE_MODELS_ENV, ""), _load_configured)

# A builder writes a complete model folder: builder(out_dir, seed, on_step) -> manifest dict.
Builder = Callable[[Path, int, Callable[[int], None] | None], dict]


def _tiny_builder(cfg: ModelBuildConfig) -> Builder:
    def build(out_dir, seed, on_step=None, cache_dir=None):
        cal = cfg.calibration
        reference = None
        if cal is not None and cal.above is not None:
            reference = reference_scores(cal.above, seed, cache_dir, cal.n)
        return build_model(cfg, out_dir, seed=seed, on_step=on_step, reference=reference)

    return build


def reference_scores(name: str, seed: int, cache_dir, n: int) -> dict[str, float]:
    """Hidden-set scores of built model ``name`` on every family (built first if missing): what a
    calibrated build must beat."""
    from agent_trainer.evaluation.families import family_names
    from agent_trainer.evaluation.hidden_eval import score_model

    local = model_dir(name, seed, cache_dir, local=True)   # a local build of both compares with its own
    path = local if is_built(local) else resolve_model(name, cache_dir=cache_dir, seed=seed, progress=False)
    model, tok = load_model(path), load_tokenizer(path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            return {f: score_model(model, tok, f, n=n).score for f in family_names(include_held_out=True)}
    finally:
        torch.set_num_threads(threads)


# name -> (builder, progress-bar total). build_all builds every entry, in this order.
BUILDERS: dict[str, tuple[Builder, int]] = {
    "tiny-s": (_tiny_builder(TINY_S), TINY_S.steps),
    "tiny-m": (_tiny_builder(TINY_M), TINY_M.steps),
}


_BUILTIN = frozenset(BUILDERS)


# --- shipped models ------------------------------------------------------------------------------
SHIPPED_DIR = Path(__file__).with_name("shipped")
SHIPPED_SUMS = "SHA256SUMS.json"   # {"models": {name: {"seed", "version", "files": {file: sha256}}}}
_VERIFIED: set[str] = set()


def shipped_models() -> dict[str, dict]:
    """The models the package ships: name -> {"seed", "version", "files"} ({} when none are)."""
    try:
        return json.loads((SHIPPED_DIR / SHIPPED_SUMS).read_text())["models"]
    except (OSError, ValueError, KeyError):
        return {}


def shipped_dir(name: str, seed: int = 0) -> Path | None:
    """The package's folder of model ``name`` when it ships that seed at the current build version, else None."""
    entry = shipped_models().get(name)
    if entry is None or int(entry["seed"]) != seed:
        return None
    expected = VERSIONS.get(name, BUILD_VERSION if name in _BUILTIN else None)
    if expected is not None and int(entry["version"]) != expected:
        return None   # the code builds other bytes now: build them into the cache
    return SHIPPED_DIR / name


def verify_shipped(name: str) -> Path:
    """The shipped folder of ``name`` once every file's sha256 matches ``SHA256SUMS.json`` (checked once per
    process); raises ``ModelError`` naming the file that does not."""
    folder = SHIPPED_DIR / name
    if name in _VERIFIED:
        return folder
    files = shipped_models()[name]["files"]
    on_disk = sorted(p.name for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
    if on_disk != sorted(files):
        raise ModelError(f"shipped model {name!r}: {folder} holds {on_disk}, not the files {SHIPPED_SUMS} lists "
                         f"({sorted(files)}); reinstall agent-trainer")
    for fname, digest in files.items():
        got = file_sha256(folder / fname)
        if got != digest:
            raise ModelError(f"shipped model {name!r}: {fname} has sha256 {got[:12]}, {SHIPPED_SUMS} says "
                             f"{digest[:12]}; reinstall agent-trainer (or restore {folder / fname})")
    _VERIFIED.add(name)
    return folder


def ship(built: dict[str, Path]) -> dict[str, tuple[Path, str]]:
    """Make the seed-0 builds ``built`` (name -> folder, from ``build_all(local=True)``) the package's shipped
    files and rewrite ``SHA256SUMS.json``; returns name -> (shipped folder, weights sha256)."""
    sums = {"format": 1, "models": dict(shipped_models())}
    out = {}
    for name, folder in built.items():
        target = SHIPPED_DIR / name
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for f in sorted(Path(folder).iterdir()):
            if f.is_file():
                shutil.copyfile(f, target / f.name)
        files = {f.name: file_sha256(f) for f in sorted(target.iterdir())}
        sums["models"][name] = {"seed": 0, "version": VERSIONS.get(name, BUILD_VERSION), "files": files}
        out[name] = (target, files["model.safetensors"])
    (SHIPPED_DIR / SHIPPED_SUMS).write_text(json.dumps(sums, indent=1, sort_keys=True) + "\n")
    _VERIFIED.clear()
    return out


def provenance(path: Path) -> str:
    """``shipped`` for a folder of the package's shipped models, else ``built``."""
    return "shipped" if Path(path).resolve().parent == SHIPPED_DIR.resolve() else "built"


# Build versions of registered builders whose bytes change on their own schedule (the tiny agent);
# the built-in models use BUILD_VERSION. A new version is a new folder: a stale build is never reused.
VERSIONS: dict[str, int] = {}


def register_builder(name: str, builder: Builder, total_steps: int = 0, version: int | None = None) -> None:
    """Add a model that ``build_all`` and ``resolve_model`` build into the cache (e.g. a tiny agent).

    ``version`` names its cache folder (default ``BUILD_VERSION``): bump it whenever the builder
    makes other bytes. It does not become a *base* model (``BASE_MODELS`` lists what inner jobs may
    start from)."""
    BUILDERS[name] = (builder, total_steps)
    if version is not None:
        VERSIONS[name] = int(version)


def model_dir(name: str, seed: int = 0, cache_dir: str | os.PathLike | None = None, local: bool = False) -> Path:
    """Where model ``name`` lives: its shipped folder (``shipped_dir``), else (or with ``local``) where it is
    built in the cache (whether or not it is built yet)."""
    shipped = None if local else shipped_dir(name, seed)
    if shipped is not None:
        return shipped
    return default_cache_dir(cache_dir) / "models" / f"{name}-seed{seed}-v{VERSIONS.get(name, BUILD_VERSION)}"


def is_built(path: Path) -> bool:
    """True when ``path`` is a complete build (the manifest is written last)."""
    return (path / MANIFEST).is_file() and (path / "model.safetensors").is_file()


@contextmanager
def file_lock(lock_path: Path):
    """Hold an exclusive ``flock`` on ``lock_path`` (created with its folder): one builder/writer at a time."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _build_into_cache(name: str, seed: int, cache_dir, force: bool, progress: bool) -> Path:
    builder, total = BUILDERS[name]
    if name in _BUILTIN:
        write = lambda tmp, step: builder(tmp, seed, step, cache_dir=cache_dir)  # noqa: E731
    else:
        write = lambda tmp, step: builder(tmp, seed, step)  # noqa: E731
    return _into_cache(model_dir(name, seed, cache_dir, local=True), write, force, progress, total,
                       f"building {name}")


def _into_cache(final: Path, write: Callable[[Path, Callable | None], object], force: bool, progress: bool,
                total: int, desc: str) -> Path:
    """Run ``write(tmp_folder, on_step)`` and rename the folder to ``final``, under a lock, once."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(final.parent / f".{final.name}.lock"):
        # Another process may have finished the build while this one waited for the lock.
        if is_built(final) and not force:
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared
        try:
            bar = None
            if progress:
                from tqdm.auto import tqdm

                bar = tqdm(total=total or None, desc=desc, unit="step", leave=False)
            try:
                write(tmp, (lambda _step: bar.update(1)) if bar else None)
            finally:
                if bar:
                    bar.close()
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def import_dir(name: str, cache_dir=None) -> Path:
    """Where the imported model ``name`` lives (whether or not it is imported yet)."""
    from agent_trainer.inner_loop.models.imported import IMPORT_VERSION

    return default_cache_dir(cache_dir) / "models" / f"{name}-v{IMPORT_VERSION}"


def import_into_cache(name: str, cache_dir=None, force: bool = False, progress: bool = True) -> Path:
    """Convert the imported model ``name`` (``agent_trainer.inner_loop.models.imported``) into the cache, once."""
    from agent_trainer.inner_loop.models.imported import gguf_file, import_model

    gguf_file(name)  # a missing wheel fails here, before any lock or folder
    return _into_cache(import_dir(name, cache_dir), lambda tmp, step: import_model(name, tmp, step), force,
                       progress, 1, f"importing {name}")


def _local_model(info: BaseModel, cache_dir) -> Path:
    if info.path is not None:
        path = Path(info.path).expanduser()
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"base model {info.name!r}: {path} has no config.json; give base_models."
                                     f"{info.name}.path a Hugging Face model folder (config.json, *.safetensors, "
                                     "tokenizer files)")
        return path
    roots = ([Path(os.environ["AGENT_TRAINER_QWEN3_DIR"]).expanduser()] if os.environ.get("AGENT_TRAINER_QWEN3_DIR")
             else [])
    roots.append(default_cache_dir(cache_dir) / "hf")
    tried = [root / sub for root in roots for sub in (info.hf_folder, info.name)]
    for path in tried:
        if (path / "config.json").is_file():
            return path
    raise ModelNotFoundError(
        f"base model {info.name!r} ({info.hf_folder}) is not on disk and is never downloaded. Put the Hugging "
        f"Face folder (config.json, *.safetensors, tokenizer files) at one of: {', '.join(map(str, tried))} "
        f"(or set AGENT_TRAINER_QWEN3_DIR to the folder that holds {info.hf_folder}/); "
        f"on a CPU use tiny-s or tiny-m instead"
    )


def resolve_model(name: str, cache_dir: str | os.PathLike | None = None, build_missing: bool = True,
                  seed: int = 0, progress: bool = True) -> Path:
    """The folder of base model ``name``: the shipped files of a tiny model (checked, ``verify_shipped``), else its
    build, made on first use unless ``build_missing`` is False."""
    # The registry first: its loaders check the configured entries (a base_models entry may not take a
    # built-in name) before any folder is handed out.
    info = BASE_MODELS.get(name) or (BaseModel(name, "built") if name in BUILDERS else None)
    if shipped_dir(name, seed) is not None:
        return verify_shipped(name)
    if info is None:
        known = list(BASE_MODELS) + [b for b in BUILDERS if b not in BASE_MODELS]
        raise ModelNotFoundError(f"unknown model {name!r}; known models: {', '.join(known)}; add one with "
                                 f"base_models.<name>.path=<folder>")
    if info.kind == "local":
        return _local_model(info, cache_dir)
    if info.kind == "imported":
        path = import_dir(name, cache_dir)
        if is_built(path):
            return path
        if not build_missing:
            raise ModelNotFoundError(f"base model {name!r} is not imported yet; run at-models import")
        return import_into_cache(name, cache_dir, progress=progress)
    path = model_dir(name, seed, cache_dir)
    if is_built(path):
        return path
    if not build_missing:
        raise ModelNotFoundError(
            f"base model {name!r} is not built yet in {path.parent}; run agent_trainer.inner_loop.models.build_all() "
            f"(or at-models build) or call resolve_model({name!r}) with build_missing=True"
        )
    return _build_into_cache(name, seed, cache_dir, force=False, progress=progress)


def _build_worker(name: str, seed: int, cache_dir, force: bool, progress: bool) -> str:
    return str(_build_into_cache(name, seed, cache_dir, force, progress))


def build_all(seed: int = 0, cache_dir: str | os.PathLike | None = None, force: bool = False,
              progress: bool = True, parallel: bool = True, local: bool = False) -> dict[str, Path]:
    """Build every registered model that is missing (or all with ``force``); returns name -> folder.

    A shipped model is never built: its files are checked instead (``verify_shipped``); ``local`` builds
    those too, into the cache (to compare a build with the shipped bytes, or to ship new ones).

    Each build uses one thread, so with ``parallel`` the built-in tiny models build in worker
    processes (same bytes as a sequential build) while builders registered at run time (which a fresh
    process would not know: the tiny agent) build in this process. The workers get the cores this
    process leaves free (``usable_cores() - 1`` of them, at least one): on 2 cores, one worker builds tiny-s
    then tiny-m while the agent has the other core to itself. Three builds on two cores (one worker
    each) took 227 s; one core each way is what keeps ``at-models`` under 3 minutes (docs/baselines.md).
    """
    shipped = {} if local else {n: verify_shipped(n) for n in BUILDERS if shipped_dir(n, seed) is not None}
    todo = [n for n in BUILDERS if n not in shipped and (force or not is_built(model_dir(n, seed, cache_dir, True)))]
    cores = usable_cores()
    in_pool = [n for n in todo if n in _BUILTIN] if parallel and len(todo) > 1 and cores > 1 else []
    futures = {}
    if in_pool:
        from agent_trainer.inner_loop.isolation.launcher import spawn_pool

        here = any(n not in in_pool for n in todo)        # this process builds something meanwhile
        workers = max(1, min(len(in_pool), cores - 1 if here else cores))
        pool = spawn_pool(workers)
        futures = {n: pool.submit(_build_worker, n, seed, cache_dir, force, progress) for n in in_pool}
    try:
        for name in todo:
            if name not in futures:
                _build_into_cache(name, seed, cache_dir, force, progress)
        for fut in futures.values():
            fut.result()
    finally:
        if futures:
            pool.shutdown(wait=True, cancel_futures=True)
    return {name: shipped.get(name) or model_dir(name, seed, cache_dir, local=True) for name in BUILDERS}


def load_tokenizer(path: str | os.PathLike):
    """The tokenizer saved with a model folder (never from the hub)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_existing(path), local_files_only=True)


def load_model(path: str | os.PathLike, dtype: torch.dtype = torch.float32):
    """The causal LM saved in a model folder, in eval mode (never from the hub)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(_existing(path), dtype=dtype, local_files_only=True)
    return model.eval()


def model_hash(path: str | os.PathLike) -> str:
    """sha256 of the model's weights: from ``manifest.json`` when present, else computed."""
    path = _existing(path)
    manifest = path / MANIFEST
    if manifest.is_file():
        files = json.loads(manifest.read_text()).get("files", {})
        if "model.safetensors" in files:
            return files["model.safetensors"]
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise ModelNotFoundError(f"{path} has no model.safetensors; save the model with save_pretrained({str(path)!r})")
    return file_sha256(weights)


def _existing(path: str | os.PathLike) -> Path:
    p = Path(path)
    if not (p / "config.json").is_file():
        raise ModelNotFoundError(
            f"{p} is not a model folder (no config.json); pass a folder from resolve_model(name) or save_pretrained"
        )
    return p
