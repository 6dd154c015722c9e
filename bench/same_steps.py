"""Whether two runs made the same numbers step by step: ``metrics.jsonl`` compared key by key, clocks excluded.

    python bench/same_steps.py runs/before/metrics.jsonl runs/after/metrics.jsonl
    python bench/same_steps.py OLD NEW --common     # across a change that adds or drops metrics: keys in one
                                                    # run only are listed, the rest compared

For refactors that must not change behaviour: the outer loop is deterministic for a seed, so every key
that is not wall-clock time, money priced on it (``usd_measured*``) or a job-cache count must be equal at
every step (``usd`` is the compute the ledger charges: equal too). Exit 0 when they are, 1 (with the first
differences) when not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CLOCK_WORDS = ("seconds", "usd_measured", "cache_hits", "cache_misses")


def rows(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def compared(key: str) -> bool:
    return not any(word in key for word in CLOCK_WORDS)


def one_sided(a: list[dict], b: list[dict]) -> tuple[set[str], set[str]]:
    """Keys only the first run has, and keys only the second has (any step)."""
    ka, kb = {k for r in a for k in r}, {k for r in b for k in r}
    return ka - kb, kb - ka


def differences(a: list[dict], b: list[dict], skip: set[str] = frozenset()) -> list[str]:
    out = [] if len(a) == len(b) else [f"{len(a)} steps vs {len(b)}"]
    for x, y in zip(a, b):
        for key in sorted(k for k in set(x) | set(y) if compared(k) and k not in skip):
            if x.get(key) != y.get(key):
                out.append(f"step {x.get('step')}: {key} {x.get(key)!r} != {y.get(key)!r}")
    return out


def main(argv: list[str]) -> int:
    common = "--common" in argv
    argv = [x for x in argv if x != "--common"]
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    a, b = rows(argv[0]), rows(argv[1])
    skip: set[str] = set()
    if common:
        only_a, only_b = one_sided(a, b)
        skip = only_a | only_b
        for label, keys in (("first", only_a), ("second", only_b)):
            if keys:
                print(f"only in the {label} run (not compared): {', '.join(sorted(keys))}")
    diff = differences(a, b, skip)
    keys = sorted(k for k in a[0] if compared(k) and k not in skip) if a else []
    if diff:
        print(f"different: {len(diff)} value(s)\n" + "\n".join(diff[:20]))
        return 1
    print(f"same: {len(a)} steps x {len(keys)} keys (not compared: keys with {', '.join(CLOCK_WORDS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
