"""The local backend's KV cache in decoding: transformers' ``DynamicCache`` (every step concatenates each layer's
keys and values into new tensors) vs ``growing_cache`` (each step writes its one position into spare room).

SmolLM2-135M (the imported ``smollm2-135m``), 8 rows of ``--positions`` cached positions, ``--steps`` decode steps
a side, the sides alternated ``--rounds`` times (the median round is compared); the logits of the last step must
be equal both ways.

    .venv/bin/python bench/kv_cache.py                      # 8 rows x 1,500 positions (a late agent turn)
    .venv/bin/python bench/kv_cache.py --positions 400      # an early turn

Prints ``RATIO kv_cache_decode_step`` (DynamicCache's seconds a step over the growing cache's; target >= 1.1).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402


def main() -> None:
    p = C.parser(__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--positions", type=int, default=1500)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="torch threads (the agent's sampling uses 2 here)")
    a = p.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    from agent_trainer.inner_loop.models import resolve_model
    from agent_trainer.outer_loop.agents.local import _cache_kw
    from agent_trainer.outer_loop.agents.prefix_cache import growing_cache

    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m"), dtype=torch.float32,
                                                 local_files_only=True).eval()
    kw = _cache_kw()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        out = model(input_ids=torch.randint(100, 20000, (a.rows, a.positions), generator=gen), use_cache=True,
                    logits_to_keep=1)
        kv = [(k.clone(), v.clone()) for k, v, *_ in getattr(out, kw)]
        tokens = torch.randint(100, 20000, (a.steps, a.rows, 1), generator=gen)

        def decode(make) -> tuple[float, torch.Tensor]:
            cache, width = make(), a.positions
            t0 = time.perf_counter()
            for s in range(a.steps):
                width += 1
                res = model(input_ids=tokens[s], attention_mask=torch.ones((a.rows, width), dtype=torch.long),
                            use_cache=True, logits_to_keep=1, **{kw: cache})
                cache = getattr(res, kw)
            return (time.perf_counter() - t0) / a.steps, res.logits

        sides: dict[str, list[float]] = {"DynamicCache": [], "growing_cache": []}
        for r in range(a.rounds):
            t_dyn, l_dyn = decode(lambda: DynamicCache(kv))
            t_grow, l_grow = decode(lambda: growing_cache(kv))
            sides["DynamicCache"].append(t_dyn)
            sides["growing_cache"].append(t_grow)
            if not torch.equal(l_dyn, l_grow):
                raise SystemExit(f"the logits differ: max |d| {(l_dyn - l_grow).abs().max():.3g}")
    med = {k: statistics.median(v) for k, v in sides.items()}
    C.table([(k, f"{med[k] * 1e3:.0f}", " ".join(f"{x * 1e3:.0f}" for x in v)) for k, v in sides.items()],
            ("cache", "ms a decode step (median)", "rounds"))
    print(f"{a.rows} rows x {a.positions} cached positions, {a.steps} steps a side, logits equal")
    result = C.ratio("kv_cache_decode_step", med["DynamicCache"] / med["growing_cache"], ">= 1.1")
    C.write(a.json, "kv_cache", {"rows": a.rows, "positions": a.positions, "steps": a.steps,
                                 "seconds_per_step": med, "ratios": [result]})


if __name__ == "__main__":
    main()
