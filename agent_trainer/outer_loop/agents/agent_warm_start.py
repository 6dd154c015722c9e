"""A pretrained causal LM as the agent, warm-started on the scripted novice's transcripts in its own chat format.

    at-episode agent=smollm2                         # agent.model: smollm2-agent, built here on first use
    >>> from agent_trainer.outer_loop.agents.agent_warm_start import resolve_agent
    >>> resolve_agent("smollm2-agent")               # <cache>/models/smollm2-agent-seed0-v2/
    >>> resolve_agent("smollm2-135m")                # any other name: agent_trainer.inner_loop.models.resolve_model

Built once, on first use and under a lock, into the model cache (not by ``at-models``), with a progress bar
over the transcripts and the training steps (into a log once a minute; ``progress=False``: none). What it is
trained on and how: docs/agents.md, "A pretrained agent".
"""

from __future__ import annotations

import logging
import random
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

WARM_START_VERSION = 2   # bump when the transcripts or the training change: a new cache folder
_VALID = re.compile(r": VALID \(")


@dataclass(frozen=True)
class WarmStart:
    """How an agent model is warm-started from a base model of the registry.

    Measured on the 2-core CPU, one thread: ~12 s a step of one ~1.1 K-token transcript for SmolLM2-135M
    (two threads on a busy machine: ~80 s); 32 steps ~7 minutes with the transcripts and the save."""

    base: str                        # a model of the registry (agent_trainer.inner_loop.models)
    tool_schemas: str = "full"       # as the agent config gives tools (agent.tool_schemas)
    tool_format: str = "auto"
    n_transcripts: int = 32          # successful novice episodes (more are played and the rest dropped)
    epochs: int = 1
    # False: a turn that wrote a job file the next validate_job called INVALID stays in the transcript as context
    # (the agent still learns to fix what validation reports) but is no target: the agent is not taught the
    # novice's mistakes.
    learn_invalid_writes: bool = True
    lr: float = 1e-3
    lora_r: int = 16
    lora_alpha: float = 32.0
    threads: int = 1


WARM_STARTS: dict[str, WarmStart] = {
    "smollm2-agent": WarmStart(base="smollm2-135m"),
    # Twice the transcripts, two epochs, and the novice's invalid files not learned: its first job files pass
    # validation 20 times in 20 before any RL, smollm2-agent's once (scripts/agent_probe.py;
    # docs/results/2026-12-06-smollm2-valid-warm-start.md). The warm start of experiment=smollm2_cpu. ~35 minutes to
    # build on 2 cores.
    "smollm2-agent-valid": WarmStart(base="smollm2-135m", n_transcripts=64, epochs=2, learn_invalid_writes=False),
}


def warm_start_dir(name: str, seed: int = 0, cache_dir=None) -> Path:
    """Where the warm-started agent ``name`` lives (whether or not it is built yet)."""
    from agent_trainer.paths import cache_dir as default_cache_dir

    return default_cache_dir(cache_dir) / "models" / f"{name}-seed{seed}-v{WARM_START_VERSION}"


def resolve_agent(name: str, cache_dir=None, seed: int = 0, progress: bool = True) -> Path:
    """The folder of agent model ``name``: a warm start of ``WARM_STARTS`` (built on first use), else the
    registry's model (``agent_trainer.inner_loop.models.resolve_model``: tiny-agent, smollm2-135m, base_models entries).
    ``progress``: progress bars while a model is built (``_progress_bar``)."""
    from agent_trainer.inner_loop.models import resolve_model

    if name not in WARM_STARTS:
        return resolve_model(name, cache_dir=cache_dir, progress=progress)
    from agent_trainer.inner_loop.models.registry import file_lock, is_built

    final = warm_start_dir(name, seed, cache_dir)
    if is_built(final):
        return final
    base = resolve_model(WARM_STARTS[name].base, cache_dir=cache_dir, progress=progress)
    with file_lock(final.parent / f".{final.name}.lock"):
        if is_built(final):
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
        tmp.chmod(0o755)
        try:
            log.warning("building the agent %s: a warm start of %s on novice transcripts (minutes, once)", name,
                        WARM_STARTS[name].base)
            warm_start(base, tmp, WARM_STARTS[name], seed=seed, name=name, progress=progress)
            if final.exists():
                shutil.rmtree(final)
            tmp.replace(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def successful(messages: list[dict[str, Any]]) -> bool:
    """True when the novice's last ``validate_job`` before its submission said VALID."""
    results = [m.get("content") or "" for m in messages if m.get("role") == "tool" and m.get("name") == "validate_job"]
    return bool(results) and bool(_VALID.search(results[-1]))


def invalid_writes(messages: list[dict[str, Any]]) -> set[int]:
    """Indices of the assistant messages that wrote a file the next ``validate_job`` called INVALID (before any
    other write)."""
    out: set[int] = set()
    writes: list[int] = []
    for i, m in enumerate(messages):
        calls = [c["function"]["name"] for c in m.get("tool_calls") or []] if m.get("role") == "assistant" else []
        if "write_file" in calls:
            writes.append(i)
        elif m.get("role") == "tool" and m.get("name") == "validate_job" and writes:
            if not _VALID.search(m.get("content") or ""):
                out.update(writes)
            writes = []
    return out


def _progress_bar(progress: bool, **kwargs):
    """A ``tqdm.auto`` bar (``kwargs``: total, desc, unit), none when ``progress`` is false; cleared when it closes.
    On a terminal it redraws as tqdm does; into a log (stderr not a terminal: at-train under nohup or a scheduler)
    at most once a minute, so a build of tens of minutes shows how far it is without filling the log."""
    import sys

    from tqdm.auto import tqdm

    return tqdm(disable=not progress, leave=False, mininterval=0.1 if sys.stderr.isatty() else 60.0, **kwargs)


def transcripts(tokenizer, cfg: WarmStart, seed: int = 0, max_tries: int = 8,
                progress: bool = True) -> list[tuple[list[int], list[int]]]:
    """``cfg.n_transcripts`` successful novice episodes as (token ids, assistant mask) in ``tokenizer``'s chat
    format, rendered as the local backend renders them; ``progress``: a bar over them (``_progress_bar``)."""
    from agent_trainer.outer_loop.agents.agent_model import encode_transcript, play_novice, training_tasks
    from agent_trainer.outer_loop.agents.chat_prompt import template_support
    from agent_trainer.outer_loop.episode.episode import tool_schemas_for
    from agent_trainer.outer_loop.episode.tools import SCHEMAS

    tools = tool_schemas_for(SCHEMAS, cfg.tool_schemas)
    support = template_support(tokenizer)
    tasks = training_tasks()
    rng = random.Random(f"agent-warm-start/{seed}")
    out = []
    work = Path(tempfile.mkdtemp(prefix="agent-warm-start-"))
    try:
        with _progress_bar(progress, total=cfg.n_transcripts, desc="novice transcripts", unit="transcript") as bar:
            for i in range(cfg.n_transcripts * max_tries):
                if len(out) == cfg.n_transcripts:
                    break
                messages = play_novice(tasks[i % len(tasks)], rng, work / f"{i:04d}", tool_style=cfg.tool_schemas)
                bar.set_postfix(played=i + 1, refresh=False)
                if successful(messages):
                    quiet = set() if cfg.learn_invalid_writes else invalid_writes(messages)
                    out.append(encode_transcript(messages, tokenizer, tools, support=support,
                                                 tool_format=cfg.tool_format, context_only=quiet))
                    bar.update(1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def warm_start(base_dir: str | Path, out_dir: str | Path, cfg: WarmStart, seed: int = 0, name: str = "",
               progress: bool = True) -> dict:
    """Supervise a LoRA of the model in ``base_dir`` on novice transcripts, merge it, save into ``out_dir``;
    ``progress``: bars over the transcripts and the training steps (``_progress_bar``)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_trainer.inner_loop.models.build import write_manifest

    t0 = time.time()
    out = Path(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(base_dir, local_files_only=True)
    sequences = transcripts(tokenizer, cfg, seed, progress=progress)
    t_transcripts = time.time() - t0
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, local_files_only=True)
            model = get_peft_model(base, LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha,
                                                    target_modules="all-linear", task_type="CAUSAL_LM"))
            losses = _train(model, sequences, cfg, seed, progress)
        merged = model.merge_and_unload()
    finally:
        torch.set_num_threads(threads)
    merged.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    lengths = [len(ids) for ids, _ in sequences]
    info = {"name": name, "kind": "agent_warm_start", "base": cfg.base, "base_dir": str(base_dir), "seed": seed,
            "warm_start": asdict(cfg), "warm_start_version": WARM_START_VERSION, "transcripts": len(sequences),
            "mean_tokens": sum(lengths) / max(1, len(lengths)), "loss_first": losses[0] if losses else None,
            "loss_last_tenth": _tail_mean(losses),
            "seconds": {"transcripts": round(t_transcripts, 1), "total": round(time.time() - t0, 1)}}
    return write_manifest(out, info)


def _tail_mean(values: list[float]) -> float | None:
    tail = values[-max(1, len(values) // 10):]
    return sum(tail) / len(tail) if tail else None


def _train(model, sequences, cfg: WarmStart, seed: int, progress: bool = True) -> list[float]:
    """One transcript a step, ``cfg.epochs`` passes in a seeded order; the output layer runs on the positions
    whose next token is the assistant's only (a 49 K vocabulary over every position costs a fifth of a step).
    ``progress``: a bar over the steps, with the last loss."""
    inner = model.get_base_model()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    model.train()
    with _progress_bar(progress, total=cfg.epochs * len(sequences), desc="warm start training", unit="step") as bar:
        for _ in range(cfg.epochs):
            for i in torch.randperm(len(sequences), generator=gen).tolist():
                ids = torch.tensor([sequences[i][0]])
                pick = torch.tensor(sequences[i][1][1:], dtype=torch.bool)
                hidden = inner.model(input_ids=ids).last_hidden_state[0, :-1]
                logits = inner.lm_head(hidden[pick])
                loss = torch.nn.functional.cross_entropy(logits.float(), ids[0, 1:][pick])
                loss.backward()
                torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(float(loss.detach()))
                log.debug("warm start step %d: loss %.4f", len(losses), losses[-1])
                bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
                bar.update(1)
    model.eval()
    return losses
