"""Whether a PiSSA adapter depends on MKL's code path: tiny-m wrapped in ``grpo_lora``'s LoRA (r 16, PiSSA) under
``MKL_CBWR=COMPATIBLE``, ``AVX2`` and unset, with PEFT's init and with the portable one
(``agent_trainer.inner_loop.train.pissa``), each in a fresh process with one thread; prints the hash of the adapter
(A and B) and of the base's residual weights, and the init's seconds.

    .venv/bin/python bench/pissa_paths.py

An adapter hash that moves with ``MKL_CBWR`` depends on the CPU's MKL code path, so possibly on the vendor. The
residual ``W - scale * B @ A`` is a float32 matrix product: it moves with MKL's branch in both inits, and under
``COMPATIBLE`` it is the product MKL documents as the same on Intel and AMD.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

BRANCHES = ("COMPATIBLE", "AVX2", "")


def one(init: str) -> str:
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from agent_trainer.inner_loop.models.registry import resolve_model
    from agent_trainer.inner_loop.spec.jobspec import PeftSpec
    from agent_trainer.inner_loop.train.config import lora_config

    torch.set_num_threads(1)
    if init == "portable":   # whatever the branch: the point is to compare the portable init across branches
        from peft.tuners.lora.layer import LoraLayer

        from agent_trainer.inner_loop.train.pissa import _portable_init

        LoraLayer.pissa_init = _portable_init(LoraLayer.pissa_init)
    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-m"), dtype=torch.float32)
    t0 = time.perf_counter()
    model = get_peft_model(model, lora_config(PeftSpec(r=16, alpha=16, init="pissa")))
    seconds = time.perf_counter() - t0
    adapter, base = hashlib.sha256(), hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        (adapter if "lora_" in name else base).update(name.encode() + p.detach().numpy().tobytes())
    return f"{adapter.hexdigest()[:12]} {base.hexdigest()[:12]} {seconds:.2f}"


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        print(one(sys.argv[2]))
        return 0
    rows = []
    for init in ("peft", "portable"):
        for branch in BRANCHES:
            env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
            env.update(ATEN_CPU_CAPABILITY="avx2", OMP_NUM_THREADS="1", **({"MKL_CBWR": branch} if branch else {}))
            out = subprocess.run([sys.executable, __file__, "--one", init], env=env, capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"{init} {branch or 'unset'} failed:\n{out.stderr[-2000:]}")
            rows.append((init, branch or "unset", *out.stdout.split()[-3:]))
    C.table(rows, ("init", "MKL_CBWR", "adapter A,B", "base residual", "init s"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
