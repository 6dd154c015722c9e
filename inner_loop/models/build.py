"""Build one tiny Qwen3 base model: a fresh ``Qwen3ForCausalLM``, briefly pretrained on the task families.

    >>> from inner_loop.models.build import TINY_S, build_model
    >>> build_model(TINY_S, "out/tiny-s", seed=0)   # writes safetensors, tokenizer files, manifest.json

The pretraining is deliberately short: the models must know the text format and a little of
every task, so that the hidden-eval baseline is low but not zero (the agent's job is to raise
it). Text format: ``prompt + answer + <|im_end|>``; the loss covers the answer and the eos token
only, which is also what the inner trainers optimise (TRL's completion-only loss).

Determinism: one CPU thread, ``torch.use_deterministic_algorithms(True)``, a fixed data order drawn
from the family generators with the build seed; the same seed gives byte-identical safetensors
on the same machine and library versions (the manifest records both).
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from inner_loop.models.tokenizer import build_tokenizer

# Bump when anything that changes the built bytes changes (configs, corpus, format, loop).
BUILD_VERSION = 2
MANIFEST = "manifest.json"

# Per-family share of the pretraining stream, calibrated so that every family ends low but above
# zero: triage is learnt from a few key phrases and unit_convert / sort_numbers jump past 50% soon
# after they click, so they get little; calc_chain needs the most to leave the floor.
DEFAULT_MIX = {
    "calc_chain": 3.0,
    "count_char": 1.0,
    "reverse_text": 0.8,
    "sort_numbers": 0.6,
    "triage": 0.02,
    "unit_convert": 0.35,
}


@dataclass(frozen=True)
class ModelBuildConfig:
    """Architecture and pretraining recipe of one tiny model."""

    name: str
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 192
    steps: int = 650
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 50
    weight_decay: float = 0.0
    mix: dict = field(default_factory=lambda: dict(DEFAULT_MIX))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


# Step counts come from one long run per model with a hidden eval every 50 steps (the constant rate
# makes step k of that run identical to a k-step build): tiny-s stops where every family is in
# [0.02, 0.5], tiny-m where it beats tiny-s on every family and is still <= 0.5. See docs/baselines.md.
TINY_S = ModelBuildConfig(name="tiny-s", hidden_size=64, num_layers=2, intermediate_size=192, steps=650)
TINY_M = ModelBuildConfig(
    name="tiny-m", hidden_size=96, num_layers=3, num_heads=4, num_kv_heads=2, intermediate_size=288, steps=850
)


def qwen3_config(cfg: ModelBuildConfig, tokenizer) -> "Qwen3Config":
    """The ``Qwen3Config`` of a tiny model (tied embeddings, Qwen3 special token ids)."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )


def pretraining_rows(cfg: ModelBuildConfig, seed: int) -> list[tuple[str, str]]:
    """The (prompt, answer) stream in training order: ``steps * batch_size`` rows, mixed by ``cfg.mix``."""
    from evaluation.families import get_family

    names = sorted(cfg.mix)
    rng = random.Random(f"pretrain/{cfg.name}/{seed}")
    picks = rng.choices(names, weights=[cfg.mix[n] for n in names], k=cfg.steps * cfg.batch_size)
    # Training-pool items only (the agent-facing generator), so no hidden item is ever pretrained on.
    pools = {n: iter(get_family(n).training_examples(seed=seed, n=max(1, picks.count(n)))) for n in names}
    return [(ex.prompt, ex.answer) for ex in (next(pools[n]) for n in picks)]


def _encode(rows: list[tuple[str, str]], tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded input ids and labels (-100 on prompt and padding)."""
    # The Rust tokenizer directly: the transformers wrapper is ~2x slower on 100k rows.
    encode = tokenizer.backend_tokenizer.encode_batch
    prompt_ids = [e.ids for e in encode([p for p, _ in rows], add_special_tokens=False)]
    full_ids = [e.ids for e in encode([p + a for p, a in rows], add_special_tokens=False)]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    width = max(len(f) for f in full_ids) + 1
    ids, labels = [], []
    for p, f in zip(prompt_ids, full_ids):
        fill = width - len(f) - 1
        ids.append(f + [eos] + [pad] * fill)
        labels.append([-100] * len(p) + f[len(p):] + [eos] + [-100] * fill)
    return torch.tensor(ids), torch.tensor(labels)


def pretrain(model, tokenizer, cfg: ModelBuildConfig, seed: int, on_step: Callable[[int], None] | None = None) -> float:
    """Plain AdamW loop, linear warmup then constant rate; returns the mean loss of the last 50 steps."""
    ids, labels = _encode(pretraining_rows(cfg, seed), tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))

    # Warmup then a constant rate: a build with N steps then equals the first N steps of a longer
    # one, so a single long run with evaluations along the way calibrates the step counts exactly.
    def lr_at(step: int) -> float:
        return min(1.0, (step + 1) / cfg.warmup_steps)

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    losses = []
    for step in range(cfg.steps):
        sl = slice(step * cfg.batch_size, (step + 1) * cfg.batch_size)
        b_ids, b_labels = ids[sl], labels[sl]
        # Trim the batch to its longest row: right padding never affects earlier positions in a
        # causal model, so no attention mask is needed.
        width = int((b_ids != tokenizer.pad_token_id).sum(1).max())
        out = model(input_ids=b_ids[:, :width], labels=b_labels[:, :width])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
        if on_step:
            on_step(step + 1)
    model.eval()
    return sum(losses[-50:]) / len(losses[-50:])


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def library_versions() -> dict[str, str]:
    import tokenizers
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "python": platform.python_version()}


def write_manifest(out_dir: Path, info: dict) -> dict:
    """Write ``manifest.json`` with the sha256 of every other file in ``out_dir``."""
    files = {p.name: file_sha256(p) for p in sorted(out_dir.iterdir()) if p.is_file() and p.name != MANIFEST}
    manifest = {"build_version": BUILD_VERSION, **info, "libraries": library_versions(), "files": files}
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def build_model(cfg: ModelBuildConfig, out_dir: str | Path, seed: int = 0, tokenizer=None,
                on_step: Callable[[int], None] | None = None) -> dict:
    """Build, pretrain and save one model into ``out_dir``; returns its manifest."""
    from transformers import Qwen3ForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer or build_tokenizer()
    threads = torch.get_num_threads()
    det = torch.are_deterministic_algorithms_enabled()
    # One thread: float sums are then reduced in one fixed order, so the bytes repeat exactly.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(qwen3_config(cfg, tokenizer))
        t0 = time.perf_counter()
        final_loss = pretrain(model, tokenizer, cfg, seed, on_step=on_step)
        seconds = time.perf_counter() - t0
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    info = {"name": cfg.name, "seed": seed, "config": asdict(cfg), "final_loss": round(final_loss, 4),
            "params": sum(p.numel() for p in model.parameters()), "pretrain_seconds": round(seconds, 1)}
    # pretrain_seconds varies run to run: keep it out of the hashed files (it lives in the manifest only).
    return write_manifest(out_dir, info)
