"""A plain TRL script: SFT a model on prompt/answer rows, then greedy-decode and score an eval set.

The baseline of bench/harness_overhead.py: the same training and evaluation as an ``at-job`` SFT job,
with none of the harness (no validation, no child process, no budget guard, no step log, no
checkpoint check, no baseline). It reads its rows and eval items from JSONL files and prints one
JSON line ``{"score", "seconds": {"import", "train", "save", "eval", "total"}}``.

    python bench/plain_trl.py --model ~/.cache/agent-trainer/models/tiny-s-seed0-v2 \\
        --rows rows.jsonl --eval eval.jsonl --steps 400 --out /tmp/plain
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

T0 = time.perf_counter()


def train_and_eval(model_dir: str, rows: list[dict], eval_items: list[dict], *, steps: int, batch_size: int = 64,
                   lr: float = 3e-3, scheduler: str = "cosine", warmup: float = 0.05, seed: int = 0,
                   max_new_tokens: int = 6, eval_batch: int = 64, out: str = "plain-out", family: str = "calc_chain",
                   threads: int | None = 1) -> dict:
    """Train with TRL's SFTTrainer, save, reload, score; returns the score and the time of each part."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from agent_trainer.evaluation.families import get_family

    if threads:
        torch.set_num_threads(threads)
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    args = SFTConfig(output_dir=str(Path(out) / "trl"), max_steps=steps, learning_rate=lr, lr_scheduler_type=scheduler,
                     warmup_steps=warmup, weight_decay=0.0, max_grad_norm=1.0, per_device_train_batch_size=batch_size,
                     gradient_accumulation_steps=1, seed=seed, data_seed=seed, use_cpu=True, bf16=False, fp16=False,
                     activation_checkpointing=False, report_to="none", save_strategy="no", logging_steps=1,
                     disable_tqdm=True, dataloader_num_workers=0, completion_only_loss=True, packing=False,
                     max_length=512, dataset_num_proc=None)
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
    data = Dataset.from_list([{"prompt": r["prompt"], "completion": r["answer"]} for r in rows])
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    seconds["train"] = time.perf_counter() - t

    t = time.perf_counter()
    trainer.model.save_pretrained(Path(out) / "model", safe_serialization=True)
    tok.save_pretrained(Path(out) / "model")
    seconds["save"] = time.perf_counter() - t

    t = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(Path(out) / "model", dtype=torch.float32, local_files_only=True).eval()
    tok.padding_side = "left"
    fam = get_family(family)
    scores = []
    with torch.inference_mode():
        for i in range(0, len(eval_items), eval_batch):
            batch = eval_items[i:i + eval_batch]
            enc = tok([e["prompt"] for e in batch], return_tensors="pt", padding=True, add_special_tokens=False)
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
            texts = tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            scores += [fam.score_one(c, e["answer"]) for c, e in zip(texts, batch)]
    seconds["eval"] = time.perf_counter() - t
    return {"score": sum(scores) / len(scores), "seconds": {k: round(v, 3) for k, v in seconds.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--rows", required=True, type=Path)
    p.add_argument("--eval", required=True, type=Path)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="plain-out")
    a = p.parse_args()
    t_import = time.perf_counter()
    import trl  # noqa: F401  (the import a fresh process pays, counted like the harness's)

    imported = time.perf_counter() - t_import
    rows = [json.loads(x) for x in a.rows.read_text().splitlines()]
    items = [json.loads(x) for x in a.eval.read_text().splitlines()]
    res = train_and_eval(a.model, rows, items, steps=a.steps, batch_size=a.batch_size, lr=a.lr, seed=a.seed,
                         out=a.out, threads=a.threads)
    res["seconds"]["import"] = round(imported, 3)
    res["seconds"]["total"] = round(time.perf_counter() - T0, 3)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
