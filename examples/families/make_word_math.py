"""Write word_math.jsonl, the rows of the example data family (deterministic: same file every run).

    python examples/families/make_word_math.py        # rewrites examples/families/word_math.jsonl

One-step word problems over small numbers, ``{"prompt": "word: ... =", "answer": "<number>"}``.
The family card is ``word_math.yaml`` beside it; use it with ``task.include_path=[examples/families]``.
"""

import itertools
import json
import random
from pathlib import Path

NAMES = ["Ann", "Ben", "Cal", "Dee", "Eli", "Fay", "Gus", "Ida"]
ITEMS = ["apples", "books", "coins", "pens", "shells", "stamps"]
TEMPLATES = [
    ("{n} has {a} {i} and gets {b} more. How many {i} now?", lambda a, b: a + b),
    ("{n} has {a} {i} and gives away {b}. How many {i} are left?", lambda a, b: a - b),
    ("{n} buys {a} bags of {b} {i}. How many {i} in all?", lambda a, b: a * b),
]


def rows() -> list[dict]:
    out = []
    for (text, op), name, item, a, b in itertools.product(TEMPLATES, NAMES, ITEMS, range(2, 10), range(1, 6)):
        if op(a, b) < 0:
            continue
        out.append({"prompt": "word: " + text.format(n=name, a=a, b=b, i=item) + " =", "answer": str(op(a, b))})
    random.Random("word_math/v1").shuffle(out)
    return out


if __name__ == "__main__":
    path = Path(__file__).with_name("word_math.jsonl")
    data = rows()
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    print(f"wrote {len(data)} rows to {path}")
