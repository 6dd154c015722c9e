"""How likely the agent was to choose SFT, per outer step: at the token where each training episode's job.yaml
names its algorithm (``algorithm: sft`` or ``grpo``), the probability the policy gave SFT when it sampled that
token, read from the episode's stored log-probs (no model run; the agent's tokenizer decodes the tokens).

    .venv/bin/python scripts/choice_probs.py runs/<experiment>/<run id> [<another run> ...]
    .venv/bin/python scripts/choice_probs.py <run A> <run B> --adapters   # also: how alike their LoRA updates are

It also prints what the reward paid each choice: the mean advantage (reward minus the mean of its group, a step's
episodes of one task) and the validation and quality stages of the training episodes whose last job.yaml named
SFT or GRPO. p(sft) is exp(logprob) where the sampled token starts ``sft`` and 1 - exp(logprob) where it starts
``grpo`` (a two-way choice; DPO, rarely written, is left out), averaged over the step's choices. The share of SFT
among the sampled choices moves with the step's tasks and the sampling; p(sft) shows whether the update moved the
policy.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path


def _agent_tokenizer(run: Path):
    import yaml
    from transformers import AutoTokenizer

    from agent_trainer.outer_loop.agents.agent_warm_start import resolve_agent

    agent = yaml.safe_load((run / "config.resolved.yaml").read_text())["agent"]
    return AutoTokenizer.from_pretrained(agent.get("model_path") or resolve_agent(agent["model"], progress=False))


def _choices(trajectory: Path, tok, key: str = "algorithm:") -> list[tuple[str, float]]:
    """(first token of the value, its log-prob) where an agent turn wrote ``key``, one per turn."""
    out = []
    for line in trajectory.read_text().splitlines():
        e = json.loads(line)
        if e.get("role") != "assistant" or not e.get("token_ids"):
            continue
        ids, lps = e["token_ids"], e["logprobs"]
        if key not in tok.decode(ids):
            continue
        text = ""
        for i, piece in enumerate(tok.batch_decode([[t] for t in ids])):   # YAML is ASCII: pieces join exactly
            if text.rstrip().endswith(key) and piece.strip():
                out.append((piece.strip(), lps[i]))
                break
            text += piece
    return out


def step_rows(run: Path, tok) -> list[dict]:
    rows = []
    steps = sorted({int(p.name[1:5]) for p in (run / "episodes").glob("s*-train-*")})
    for step in steps:
        picks = [c for ep in sorted((run / "episodes").glob(f"s{step:04d}-train-*"))
                 if (ep / "trajectory.jsonl").is_file() for c in _choices(ep / "trajectory.jsonl", tok)]
        p_sft = [math.exp(lp) if w.startswith("s") else 1 - math.exp(lp) for w, lp in picks if w[:1] in "sg"]
        rows.append({"step": step, "choices": len(picks), "sft": sum(w.startswith("s") for w, _ in picks),
                     "p_sft": round(statistics.mean(p_sft), 3) if p_sft else None})
    return rows


def by_choice(run: Path) -> dict:
    """The last algorithm each training episode named -> (episodes, mean advantage, mean validation stage, mean
    quality stage); the advantage is the reward minus its group's mean (a step's episodes of one task)."""
    import re
    from collections import defaultdict

    groups, seen = defaultdict(list), defaultdict(list)
    for ep in sorted((run / "episodes").glob("s*-train-*")):
        if not (ep / "summary.json").is_file():
            continue
        summary = json.loads((ep / "summary.json").read_text())
        named = re.findall(r"algorithm: (sft|grpo|dpo)\b", (ep / "trajectory.jsonl").read_text())
        groups[(ep.name[:5], summary["task"])].append((summary["reward"], named[-1] if named else None))
    for group in groups.values():
        mean = statistics.mean(r["total"] for r, _ in group)
        for r, algorithm in group:
            if algorithm:
                seen[algorithm].append((r["total"] - mean, r["validation"], r["quality"]))
    return {a: (len(v), *(round(statistics.mean(x[i] for x in v), 3) for i in range(3))) for a, v in seen.items()}


def adapter_cosines(a: Path, b: Path) -> dict[str, float]:
    """Per checkpoint both runs have: the cosine between their LoRA updates (B A of every module, all together)."""
    from safetensors.torch import load_file

    out = {}
    for ck in sorted((a / "checkpoints").glob("step_*")):
        other = b / "checkpoints" / ck.name / "adapter" / "adapter_model.safetensors"
        if not other.is_file():
            continue
        wa, wb = load_file(ck / "adapter" / "adapter_model.safetensors"), load_file(other)
        dot = na = nb = 0.0
        for key in (k for k in wa if "lora_A" in k):
            b_key = key.replace("lora_A", "lora_B")
            da, db = wa[b_key].float() @ wa[key].float(), wb[b_key].float() @ wb[key].float()
            dot, na, nb = dot + (da * db).sum().item(), na + (da * da).sum().item(), nb + (db * db).sum().item()
        out[ck.name] = round(dot / math.sqrt(na * nb), 4) if na and nb else float("nan")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="at-train run folders")
    p.add_argument("--adapters", action="store_true", help="two runs: the cosine of their LoRA updates per step")
    a = p.parse_args()
    for run in a.runs:
        if not (run / "episodes").is_dir():
            raise SystemExit(f"{run}: no episodes folder (give an at-train run folder)")
        print(run)
        for r in step_rows(run, _agent_tokenizer(run)):
            print(f"  step {r['step']:2d}: {r['choices']:2d} choices written, {r['sft']:2d} SFT, mean p(sft) "
                  + (f"{r['p_sft']:.3f}" if r["p_sft"] is not None else "-"))
        for algorithm, (n, adv, validation, quality) in sorted(by_choice(run).items()):
            print(f"  episodes naming {algorithm} last: {n}, mean advantage {adv:+.3f}, validation stage "
                  f"{validation:.3f}, quality stage {quality:+.3f}")
    if a.adapters:
        if len(a.runs) != 2:
            raise SystemExit("--adapters compares two runs")
        print("cosine of the two runs' LoRA updates:", adapter_cosines(*a.runs))


if __name__ == "__main__":
    main()
