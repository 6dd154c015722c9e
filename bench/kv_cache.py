"""The local backend's KV cache, side by side: transformers' ``DynamicCache`` (a decode step concatenates, so it
copies the whole cache of every layer) vs ``GrowingLayer`` (``agent_trainer.outer_loop.agents.kv_cache``: new
positions written into spare room), sampling the same batch of long conversations with SmolLM2.

    .venv/bin/python bench/kv_cache.py                       # 8 rows, ~1,500-token prompts, 160 new tokens
    .venv/bin/python bench/kv_cache.py --rows 4 --new 64     # a quicker look

Each side runs ``--repeats`` times, alternating (ABAB), from no stored prefix (every row's prompt prefilled,
then decoded), and once more with one new token (the prefill alone). Prints each side's median seconds,
whole and decode (whole - prefill), that both sides sampled the same tokens, ``RATIO kv_cache_in_place``
(DynamicCache / in-place, whole) and ``RATIO kv_cache_in_place_decode`` (the decode's). In the outer loop
a turn's prompt is mostly a stored prefix, so the decode's ratio is the one sampling sees.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402


def requests(rows: int, prompt_words: int, new: int):
    from agent_trainer.outer_loop.agents.base import SampleRequest

    out = []
    for r in range(rows):
        filler = " ".join(f"step {r}-{i}: the job ran and its loss went down." for i in range(prompt_words // 9))
        messages = [{"role": "system", "content": "You write training jobs for small language models."},
                    {"role": "user", "content": f"Here is the log so far. {filler} Write the next job.yaml."}]
        out.append(SampleRequest(messages, None, 1.0, new, 100 + r))
    return out


def main() -> None:
    p = C.parser(__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prompt-words", type=int, default=1000, help="~1.5 tokens a word")
    p.add_argument("--new", type=int, default=160, help="new tokens a row at most")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    import torch

    from agent_trainer.outer_loop.agents.agent_warm_start import resolve_agent
    from agent_trainer.outer_loop.agents.local import LocalBackend

    torch.set_num_threads(2)
    backend = LocalBackend.from_path(resolve_agent("smollm2-agent", progress=False), device="cpu")
    backend.prefixes = None  # every row prefilled whole, both sides
    reqs = requests(args.rows, args.prompt_words, args.new)
    first = [dataclasses.replace(r, max_new_tokens=1) for r in reqs]
    seconds: dict[str, list[float]] = {"dynamic": [], "in_place": []}
    prefill: dict[str, list[float]] = {"dynamic": [], "in_place": []}
    tokens: dict[str, list] = {}
    for _ in range(args.repeats):
        for side in ("dynamic", "in_place"):
            backend.in_place_cache = side == "in_place"
            t0 = time.perf_counter()
            backend.generate_batch(first)  # the prompts and one token: what the decode adds to
            prefill[side].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            gens = backend.generate_batch(reqs)
            seconds[side].append(time.perf_counter() - t0)
            tokens[side] = [g.token_ids for g in gens]
    prompt = sum(g.prompt_tokens for g in gens)
    out = sum(len(t) for t in tokens["in_place"])
    print(f"{args.rows} rows, {prompt} prompt tokens, {out} new tokens; threads {torch.get_num_threads()}")
    med = statistics.median
    decode = {side: med(seconds[side]) - med(prefill[side]) for side in seconds}
    C.table([(side, f"{med(seconds[side]):.1f}", f"{med(prefill[side]):.1f}", f"{decode[side]:.1f}")
             for side in seconds], ("cache", "whole s", "prefill s", "decode s (whole - prefill)"))
    print(f"same tokens both sides: {tokens['dynamic'] == tokens['in_place']}")
    print(f"RATIO kv_cache_in_place {med(seconds['dynamic']) / med(seconds['in_place']):.2f}")
    print(f"RATIO kv_cache_in_place_decode {decode['dynamic'] / decode['in_place']:.2f}")


if __name__ == "__main__":
    main()
