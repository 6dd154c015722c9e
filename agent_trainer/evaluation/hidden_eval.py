"""Hidden evaluation: score a checkpoint on a family's hidden set with batched greedy decoding.

    >>> from agent_trainer.evaluation.hidden_eval import score_checkpoint
    >>> r = score_checkpoint("runs/x/checkpoint", "calc_chain", n=200)
    >>> r.score, r.seconds, r.samples[0]

The model is fed each hidden ``prompt`` in the task's prompt format (``agent_trainer.evaluation.prompts``: ``raw``,
exactly as the family writes it, the format the tiny base models are pretrained on; or ``chat``,
through the model's chat template) and must continue with the answer and then its eos token.
Decoding is greedy, left-padded, at most the family's ``max_new_tokens``; the family's scorer grades it.

This is the only module that reads hidden sets. It never imports ``inner_loop``: checkpoints are
loaded with ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agent_trainer.evaluation.families import HIDDEN_SEED_BASE, Example, TaskFamily, get_family
from agent_trainer.evaluation.prompts import RAW, PromptFormat, render

SAMPLES_KEPT = 5
# Below this size a CPU model decodes fastest on one thread: the per-token matrices are too small
# to split, and a second thread only spins (measured 0.3 s vs 20 s for 200 items on a busy 2-core box).
SINGLE_THREAD_PARAMS = 20_000_000


class EvalError(ValueError):
    """A checkpoint or request the harness cannot score; the message says what to fix."""


@dataclass
class EvalResult:
    """Score of one model on one family's hidden set."""

    family: str
    version: int
    n: int
    score: float
    seconds: float
    model_hash: str
    samples: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def hidden_set(family_name: str, n: int, salt: str | None = None) -> list[Example]:
    """The first ``n`` items of the family's hidden set (fixed for a family version and salt).

    ``salt``: a salt setting (``agent_trainer.salt``); default ``$AT_HIDDEN_SALT``, else public."""
    from agent_trainer.salt import hidden_salt

    fam = get_family(family_name)
    if not isinstance(n, int) or not 1 <= n <= 5000:
        raise EvalError(f"hidden set size must be an integer in [1, 5000], got {n!r}")
    return fam._draw(HIDDEN_SEED_BASE + fam.version, n, hidden=True, salt=hidden_salt(salt).value)


def checkpoint_hash(path: str | Path) -> str:
    """sha256 of the checkpoint's weights (from ``manifest.json`` when present, else hashed here)."""
    path = Path(path)
    manifest = path / "manifest.json"
    if manifest.is_file():
        files = json.loads(manifest.read_text()).get("files", {})
        if "model.safetensors" in files:
            return files["model.safetensors"]
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        raise EvalError(f"no *.safetensors weights in {path}; save the model with save_pretrained(path)")
    h = hashlib.sha256()
    for w in weights:
        with open(w, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def generate_completions(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int = 64) -> list[str]:
    """Greedy completions of ``prompts`` (left padding, stop at eos), in the input order."""
    import torch  # here, not at the top: the contamination check's child draws hidden sets without torch

    with torch.inference_mode():
        return _generate(torch, model, tokenizer, prompts, max_new_tokens, batch_size)


def _generate(torch, model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int) -> list[str]:
    if tokenizer.pad_token_id is None:
        raise EvalError("the tokenizer has no pad token; set tokenizer.pad_token before scoring")
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    device = next(model.parameters()).device
    eos = [tokenizer.eos_token_id]
    gen_eos = getattr(model.generation_config, "eos_token_id", None)
    eos += [e for e in (gen_eos if isinstance(gen_eos, list) else [gen_eos]) if e is not None and e not in eos]
    # Sort by length so each batch pads little; results go back to the caller's order.
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    out: list[str] = [""] * len(prompts)
    was_training = model.training
    threads = torch.get_num_threads()
    if device.type == "cpu" and sum(p.numel() for p in model.parameters()) < SINGLE_THREAD_PARAMS:
        torch.set_num_threads(1)
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            enc = tokenizer([prompts[i] for i in idx], return_tensors="pt", padding=True, add_special_tokens=False)
            enc = {k: v.to(device) for k, v in enc.items()}
            gen = model.generate(
                **enc, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                pad_token_id=tokenizer.pad_token_id,
            )
            new = gen[:, enc["input_ids"].shape[1] :]
            for i, text in zip(idx, tokenizer.batch_decode(new, skip_special_tokens=True)):
                out[i] = text
    finally:
        tokenizer.padding_side = old_side
        model.train(was_training)
        torch.set_num_threads(threads)
    return out


def answer_room_problem(tokenizer, family: TaskFamily, examples: list[Example],
                        model: str = "this model") -> str | None:
    """Why no completion can score when an answer takes more tokens of ``tokenizer`` than the family lets a model
    generate (a data family's card with too small a ``max_new_tokens``); None when every answer fits."""
    need = {a: len(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in {e.answer for e in examples}}
    answer, tokens = max(need.items(), key=lambda kv: (kv[1], kv[0]), default=("", 0))
    if tokens <= family.max_new_tokens:
        return None
    return (f"family {family.name}: its answer {answer[:40]!r} takes {tokens} tokens of {model}'s tokenizer, over "
            f"the {family.max_new_tokens} the family lets a model generate, so no completion could score; set "
            f"max_new_tokens: {tokens} or more in its card")


def answer_examples(model, tokenizer, family: TaskFamily, examples: list[Example], batch_size: int = 64,
                    fmt: PromptFormat = RAW) -> tuple[list[str], list[float]]:
    """The model's greedy completion of each of ``examples`` (prompts rendered in ``fmt``) and its score;
    ``EvalError`` when an answer cannot fit in the family's ``max_new_tokens``."""
    problem = answer_room_problem(tokenizer, family, examples)
    if problem:
        raise EvalError(problem)
    prompts = [render(tokenizer, e.prompt, fmt) for e in examples]
    completions = generate_completions(model, tokenizer, prompts, family.max_new_tokens, batch_size)
    return completions, [family.score_one(c, e.answer) for c, e in zip(completions, examples)]


def score_examples(model, tokenizer, family: TaskFamily, examples: list[Example], batch_size: int = 64,
                   fmt: PromptFormat = RAW) -> tuple[float, list[dict]]:
    """Mean score of the model on ``examples`` (``answer_examples``) and a few (prompt, completion, answer)
    samples."""
    completions, scores = answer_examples(model, tokenizer, family, examples, batch_size, fmt)
    samples = [{"prompt": e.prompt, "completion": c, "answer": e.answer, "score": s}
               for e, c, s in list(zip(examples, completions, scores))[:SAMPLES_KEPT]]
    return sum(scores) / len(scores), samples


def score_model(model, tokenizer, family: str | TaskFamily, n: int = 200, batch_size: int = 64,
                model_hash: str = "in-memory", fmt: PromptFormat = RAW) -> EvalResult:
    """Score an in-memory model on the first ``n`` hidden items of ``family`` (prompts in format ``fmt``)."""
    fam = get_family(family) if isinstance(family, str) else family
    t0 = time.perf_counter()
    score, samples = score_examples(model, tokenizer, fam, hidden_set(fam.name, n), batch_size, fmt)
    return EvalResult(fam.name, fam.version, n, score, round(time.perf_counter() - t0, 3), model_hash, samples)


def load_checkpoint(path: str | Path, device: str = "cpu"):
    """(model, tokenizer) from a saved checkpoint folder, float32, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise EvalError(f"{path} is not a saved model (no config.json); pass the folder given to save_pretrained")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).to(device)
    model.eval()
    return model, tokenizer


def trace_checkpoint(path: str | Path, family_name: str, n: int = 200, batch_size: int = 64, device: str = "cpu",
                     fmt: PromptFormat = RAW) -> dict:
    """A job trace's ``eval`` event (``agent_trainer.trace``): the checkpoint's weights and its answers on the first
    ``n`` hidden items, as digests (no hidden text: hashes of 20 answers at a time, the indices of items scored)."""
    from agent_trainer.trace import answers_digest, weights_digest

    fam = get_family(family_name)
    model, tokenizer = load_checkpoint(path, device)
    completions, scores = answer_examples(model, tokenizer, fam, hidden_set(fam.name, n), batch_size, fmt)
    return {"event": "eval", "family": fam.name, "n": n, **weights_digest(model.named_parameters()),
            **answers_digest(completions, scores)}


def score_checkpoint(path: str | Path, family_name: str, n: int = 200, batch_size: int = 64, device: str = "cpu",
                     fmt: PromptFormat = RAW) -> EvalResult:
    """Load a checkpoint and score it on the first ``n`` hidden items of ``family_name`` (prompts in ``fmt``)."""
    get_family(family_name)  # fail on an unknown name before loading weights
    model, tokenizer = load_checkpoint(path, device)
    return score_model(model, tokenizer, family_name, n=n, batch_size=batch_size, model_hash=checkpoint_hash(path),
                       fmt=fmt)
