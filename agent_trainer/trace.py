"""A job's trace: a digest, step by step, of what decides its next step, so two machines' runs can be compared
(docs/reproducibility.md).

    AGENT_TRAINER_TRACE=1 at-job ...                           # the job's output folder gets trace.jsonl
    .venv/bin/python bench/reproduce.py --parts jobs --jobs grpo_lora --kernels portable --trace traces/
    .venv/bin/python -m agent_trainer.trace A.jsonl B.jsonl    # the first step and quantity that differ, how far

One JSON line per event: ``trace`` (the CPU and software), ``start`` (the trainable weights before the first step,
tensor by tensor), ``step`` (the GRPO sample: completions, rewards; the RNG state; loss, gradient norm, reward;
the trainable weights after the step), ``end`` (the weights tensor by tensor) and ``eval`` (the saved model's
weights, its greedy answers on the hidden set by blocks, the items it scored). Weights are hashed exactly and with
the float32 mantissa rounded to 20 and 13 bits (~1e-6 and ~1e-4 relative), and summed in float64: two runs whose
weights part in the last bits show where they are equal at a coarser precision and by how much their sums differ.
Hashes are 12 hex digits (10 for a tensor or an answer block): a 100-step job's trace is ~30 KB, and the
comparison's few lines are what to paste into an issue.

The training process writes the step events (``agent_trainer.inner_loop.train.callbacks.Trace``), the harness the
eval event (``agent_trainer.inner_loop.run.job``). Nothing here imports torch until a digest is asked for.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any, Iterable

TRACE_ENV = "AGENT_TRAINER_TRACE"   # "1": every job's training process and the harness write TRACE_FILE
TRACE_FILE = "trace.jsonl"
# The float32 mantissa has 23 bits; kept bits -> the precision's name (the relative step 2^-bits, roughly).
ROUNDINGS = {20: "1e-6", 13: "1e-4"}
# A step's quantities in the order they arise, so the first that differs is the cause, the later ones its effects:
# the sample (drawn from the weights before the step), its rewards, the RNG after sampling, the loss and gradient,
# then the weights after the update.
# "weights" stands for its hashes at every precision (``WEIGHT_HASHES``), compared together.
STEP_KEYS = ("completions", "rewards", "rng", "reward", "loss", "grad_norm", "weights")
EVAL_KEYS = ("weights", "answers", "scored", "score")
START_KEYS = ("tensors", "weights")
WEIGHT_HASHES = ("weights", *(f"weights@{p}" for p in ROUNDINGS.values()))


def tracing() -> bool:
    """Whether this process was asked for a trace (``TRACE_ENV``)."""
    import os

    return os.environ.get(TRACE_ENV, "") not in ("", "0")


def digest(data: bytes | str, n: int = 12) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:n]


def json_digest(value: Any, n: int = 12) -> str:
    """The hash of a JSON-able value; floats by their exact repr."""
    return digest(json.dumps(value, sort_keys=True, default=str), n)


def _float32(t):
    import torch

    return t.detach().to("cpu", torch.float32).contiguous()


def rounded(t, bits: int):
    """``t`` (float32) with its mantissa rounded to ``bits`` bits, to nearest, as int32 bit patterns."""
    import torch

    drop = 23 - bits
    i = t.view(torch.int32).to(torch.int64)   # int64: the carry out of a mantissa cannot overflow
    return ((i + (1 << (drop - 1))) & ~((1 << drop) - 1)).to(torch.int32)


def weights_digest(named: Iterable[tuple[str, Any]], tensors: bool = False) -> dict[str, Any]:
    """Hashes of the tensors ``named`` (name, tensor) holds, exactly and rounded (``ROUNDINGS``), with their float64
    sum and L2 norm; ``tensors``: also each tensor's exact hash (10 hex digits), by name."""
    import torch

    named = sorted(((n, _float32(t)) for n, t in named), key=lambda nt: nt[0])
    hashes = {"weights": hashlib.sha256(), **{f"weights@{p}": hashlib.sha256() for p in ROUNDINGS.values()}}
    total, square = 0.0, 0.0
    for name, t in named:
        for h in hashes.values():
            h.update(name.encode())
        hashes["weights"].update(t.numpy().tobytes())
        for bits, p in ROUNDINGS.items():
            hashes[f"weights@{p}"].update(rounded(t, bits).numpy().tobytes())
        t64 = t.to(torch.float64)
        total += float(t64.sum())
        square += float((t64 * t64).sum())
    out: dict[str, Any] = {k: h.hexdigest()[:12] for k, h in hashes.items()}
    out.update(weights_sum=total, weights_l2=math.sqrt(square))
    if tensors:   # PEFT's wrapper prefix and adapter name add nothing but length
        out["tensors"] = {n.removeprefix("base_model.model.").replace(".default.", "."): digest(t.numpy().tobytes(), 10)
                          for n, t in named}
    return out


def answers_digest(completions: list[str], scores: list[float], block: int = 20) -> dict[str, Any]:
    """Greedy answers hashed ``block`` items at a time (which items part), and the items that scored (index: score)."""
    return {"answers": [json_digest(completions[i:i + block], 10) for i in range(0, len(completions), block)],
            "scored": {str(i): s for i, s in enumerate(scores) if s}, "score": sum(scores) / max(1, len(scores))}


def append(path: str | Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record, default=str) + "\n")


# --- comparing two traces ------------------------------------------------------------------------------------------
class TraceError(ValueError):
    """A file that is not a trace; the message says which and why."""


def read(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such file (make a trace with {TRACE_ENV}=1 or bench/reproduce.py --trace DIR)")
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except ValueError as e:
        raise TraceError(f"{path}: not JSON lines ({e})") from None
    if not rows or not all(isinstance(r, dict) and "event" in r for r in rows):
        raise TraceError(f"{path}: not a trace (every line of one is a JSON object with an 'event')")
    return rows


def _key(r: dict) -> tuple:
    return r["event"], r.get("stage", 1), r.get("step", 0)


def _where(k: tuple) -> str:
    event, stage, step = k
    at = f"step {step}" if event == "step" else f"{event} (step {step})" if event in ("start", "end") else event
    return at + (f", stage {stage}" if stage != 1 else "")


def _apart(a: Any, b: Any) -> str:
    """How far apart two values of one quantity are."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        d = abs(a - b)
        return f"{a!r} vs {b!r} (|diff| {d:.3g}, relative {d / max(abs(a), abs(b), 1e-30):.3g})"
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        parted = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        return f"{len(parted)} of {len(a)} blocks differ (first: block {parted[0]})" if parted else "equal"
    if isinstance(a, dict) and isinstance(b, dict):
        only_a, only_b = sorted(set(a) - set(b), key=int), sorted(set(b) - set(a), key=int)
        changed = sorted((k for k in set(a) & set(b) if a[k] != b[k]), key=int)
        return "; ".join(f"{what} {', '.join(ks[:10])}" for what, ks in
                         (("scored only in A:", only_a), ("only in B:", only_b), ("scored apart:", changed)) if ks)
    return f"{a} vs {b}"


def _value(r: dict, q: str) -> Any:
    return tuple(r.get(k) for k in WEIGHT_HASHES) if q == "weights" and "weights" in r else r.get(q)


def _weights_apart(a: dict, b: dict) -> str:
    """At which precisions two records' weights agree (the finest first), and how far apart their sums are."""
    agree = ", ".join(f"{'exact' if k == 'weights' else k.split('@')[1]} {'equal' if a.get(k) == b.get(k) else 'apart'}"
                      for k in WEIGHT_HASHES if k in a and k in b)
    return f"{agree}; sum {_apart(a.get('weights_sum'), b.get('weights_sum'))}"


def compare(a: list[dict], b: list[dict]) -> list[str]:
    """The differences of two traces, as lines: the first quantity that differs (events in the order of trace A,
    quantities in the order of ``STEP_KEYS`` within a step), then where each other quantity first differs; empty
    when they are the same."""
    ka, kb = {_key(r): r for r in a}, {_key(r): r for r in b}
    common = [k for k in ka if k in kb and k[0] != "trace"]
    # (training or eval, quantity) -> (event key, A's record, B's record) where it first differs
    firsts: dict[tuple[str, str], tuple] = {}
    for k in common:
        keys = STEP_KEYS if k[0] == "step" else EVAL_KEYS if k[0] == "eval" else START_KEYS
        for q in keys:
            scope = "eval" if k[0] == "eval" else "training"
            if (scope, q) not in firsts and q in ka[k] and q in kb[k] and _value(ka[k], q) != _value(kb[k], q):
                firsts[scope, q] = (k, ka[k], kb[k])
    order = {q: i for i, q in enumerate(dict.fromkeys((*START_KEYS, *STEP_KEYS, *EVAL_KEYS)))}
    out = []
    found = sorted(firsts.items(), key=lambda kv: (common.index(kv[1][0]), order[kv[0][1]]))
    for n, ((_, q), (k, ra, rb)) in enumerate(found):
        if q == "tensors":
            parted = [t for t in ra[q] if rb[q].get(t) != ra[q][t]]
            text = f"{len(parted)} of {len(ra[q])} tensors differ, the first {parted[0]}" if parted else "differ"
        elif q == "weights":
            text = _weights_apart(ra, rb)
        else:
            text = _apart(ra[q], rb[q])
        out.append(f"{'first difference' if n == 0 else 'then'}: {_where(k)}, {q}: {text}")
    only = [k for k in ka if k not in kb and k[0] != "trace"] + [k for k in kb if k not in ka and k[0] != "trace"]
    if only:
        out.append(f"in one trace only: {', '.join(_where(k) for k in only[:5])}" + (" ..." if len(only) > 5 else ""))
    return out


def header(rows: list[dict]) -> str:
    h = next((r for r in rows if r["event"] == "trace"), {})
    cpu = h.get("cpu", {})
    return ", ".join(f"{k}={v}" for k, v in cpu.items()) or "no header"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent_trainer.trace", description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path, help="a trace (trace.jsonl of a job's output, or bench/reproduce.py --trace's)")
    p.add_argument("b", type=Path, help="the trace to compare it with")
    args = p.parse_args(argv)
    try:
        a, b = read(args.a), read(args.b)
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"A: {args.a} ({header(a)})\nB: {args.b} ({header(b)})")
    diffs = compare(a, b)
    steps = sum(r["event"] == "step" for r in a)
    print("\n".join(diffs) if diffs else f"the same: {steps} steps and every digest equal")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
