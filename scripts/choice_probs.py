"""How likely the agent was to choose SFT, per outer step: at the token where each training episode's job.yaml
names its algorithm (``algorithm: sft`` or ``grpo``), the probability the policy gave SFT when it sampled that
token, read from the episode's stored log-probs (no model run; the agent's tokenizer decodes the tokens).

    .venv/bin/python scripts/choice_probs.py runs/<experiment>/<run id> [<another run> ...]

p(sft) is exp(logprob) where the sampled token starts ``sft`` and 1 - exp(logprob) where it starts ``grpo`` (a
two-way choice; DPO, rarely written, is left out), averaged over the step's choices. The share of SFT among the
sampled choices moves with the step's tasks and the sampling; p(sft) shows whether the update moved the policy.
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
        ids, lps, text = e["token_ids"], e["logprobs"], ""
        for i in range(len(ids)):
            before, text = text, tok.decode(ids[: i + 1])
            if before.rstrip().endswith(key) and text[len(before):].strip():
                out.append((text[len(before):].strip(), lps[i]))
                break
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="at-train run folders")
    a = p.parse_args()
    for run in a.runs:
        if not (run / "episodes").is_dir():
            raise SystemExit(f"{run}: no episodes folder (give an at-train run folder)")
        print(run)
        for r in step_rows(run, _agent_tokenizer(run)):
            print(f"  step {r['step']:2d}: {r['choices']:2d} choices written, {r['sft']:2d} SFT, mean p(sft) "
                  + (f"{r['p_sft']:.3f}" if r["p_sft"] is not None else "-"))


if __name__ == "__main__":
    main()
