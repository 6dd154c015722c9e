"""(b) Hidden evaluation: batched greedy decoding (the harness's) against one item at a time.

Same model (tiny-s, built by ``at-models``), same hidden items, same greedy decoding; the only
difference is ``batch_size`` of ``agent_trainer.evaluation.hidden_eval.generate_completions``. Prints both times,
the items/s, and whether the scores agree.

    .venv/bin/python bench/eval_batching.py                  # 200 items, batch 64
    .venv/bin/python bench/eval_batching.py --n 64           # a quick check
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402


def main() -> None:
    p = C.parser(__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--family", default="calc_chain")
    p.add_argument("--model", default="tiny-s")
    a = p.parse_args()
    C.one_thread()
    from agent_trainer.evaluation.families import get_family
    from agent_trainer.evaluation.hidden_eval import generate_completions, hidden_set, load_checkpoint
    from agent_trainer.inner_loop.models import resolve_model

    model, tok = load_checkpoint(resolve_model(a.model))
    fam = get_family(a.family)
    items = hidden_set(a.family, a.n)
    prompts = [e.prompt for e in items]
    generate_completions(model, tok, prompts[:4], fam.max_new_tokens, batch_size=4)  # warm-up (first-call costs)
    seconds, scores = {}, {}
    for name, bs in (("one_by_one", 1), ("batched", a.batch_size)):
        with C.clock(seconds, name):
            out = generate_completions(model, tok, prompts, fam.max_new_tokens, batch_size=bs)
        scores[name] = sum(fam.score_one(c, e.answer) for c, e in zip(out, items)) / len(items)
    C.table([(k, seconds[k], round(a.n / seconds[k], 1), f"{scores[k]:.4f}") for k in seconds],
            ("mode", "seconds", "items_per_s", "score"))
    print(f"scores agree: {scores['batched'] == scores['one_by_one']}")
    claims = [C.ratio("eval_batched_speedup", seconds["one_by_one"] / seconds["batched"], ">= 5")]
    C.write(a.json, "eval_batching", {"args": vars(a), "seconds": seconds, "scores": scores, "ratios": claims})


if __name__ == "__main__":
    main()
