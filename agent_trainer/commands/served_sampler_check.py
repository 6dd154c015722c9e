"""Check a vLLM server as at-train's served sampler: push a LoRA of the agent, sample, compare log-probs.

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True python -m vllm.entrypoints.openai.api_server --model <agent folder> \\
        --enable-lora --max-lora-rank 16 --logprobs-mode processed_logprobs --port 8000 &
    python -m agent_trainer.commands.served_sampler_check http://127.0.0.1:8000/v1 <agent folder> [out folder]

Builds the agent policy (``AgentPolicy`` with ``OuterConfig()``: the folder's model + a LoRA r16 on all
linear layers) with its ``lora_B`` drawn from N(0, 0.02) (a fresh LoRA equals the base model), pushes it with
``ServedSampler.push_adapter``, samples one turn (temperature 0.7, 48 tokens), and scores the sampled tokens
with the policy (teacher forcing at the same temperature) with and without its LoRA; then pushes a second
LoRA (B negated) and does it again. Prints JSON: seconds per push and turn, and the largest |server - policy|
and |server - base| log-prob: the first ~0 and the second not means the server sampled from the pushed LoRA
with log-probs after temperature.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(base_url: str, model_dir: str, out: str = "/tmp/served_sampler_check") -> dict:
    import torch

    from agent_trainer.outer_loop.agents.served_sampler import ServedSampler
    from agent_trainer.config import OuterConfig
    from agent_trainer.outer_loop.rl.logprobs import token_logprobs
    from agent_trainer.outer_loop.rl.policy import AgentPolicy
    from agent_trainer.outer_loop.episode.tools import SCHEMAS

    sampler = ServedSampler(base_url=base_url, model_path=model_dir)
    policy = AgentPolicy.from_pretrained(model_dir, OuterConfig())
    lora_b = [p for n, p in policy.model.named_parameters() if "lora_B" in n]
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in lora_b:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    messages = [{"role": "system", "content": "You are an agent that trains models."},
                {"role": "user", "content": "Read GUIDE.md, then finish."}]
    tools = [s for s in SCHEMAS if s["function"]["name"] in ("read_file", "finish")]
    report: dict = {"server_base_model": sampler.base_model, "max_model_len": sampler.max_model_len}
    for version in (0, 1):
        policy.version = version
        t0 = time.time()
        name = sampler.push_adapter(policy, Path(out))
        t1 = time.time()
        turn = sampler.generate(messages, tools, temperature=0.7, max_new_tokens=48, seed=0)
        t2 = time.time()
        ids = turn.prompt_ids + turn.token_ids
        batch = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
                 "temperature": torch.tensor([0.7])}
        with torch.no_grad():
            mine = token_logprobs(policy.model, batch)[0, len(turn.prompt_ids):].tolist()
            with policy.model.disable_adapter():
                base = token_logprobs(policy.model, batch)[0, len(turn.prompt_ids):].tolist()
        report[name] = {"push_s": round(t1 - t0, 2), "turn_s": round(t2 - t1, 2), "tokens": len(turn.token_ids),
                        "max_abs_vs_policy": max(abs(a - b) for a, b in zip(mine, turn.logprobs)),
                        "max_abs_vs_base": max(abs(a - b) for a, b in zip(base, turn.logprobs))}
        with torch.no_grad():
            for p in lora_b:
                p.neg_()
    sampler.close()
    return report


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    print(json.dumps(main(*sys.argv[1:4]), indent=1))
