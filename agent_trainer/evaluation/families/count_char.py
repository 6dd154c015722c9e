"""count_char: count a letter in a short string, e.g. ``count: x in jxqxxq =`` -> ``3``.

The split keys on the letter asked for and the multiset of the string's letters (``split_key``, ``GroupedFamily``): a
string with its letters in another order holds the same tokens (one a letter) and has the same count, so it is the
same item reordered and never a training item while its twin is hidden. A string with other letters is another item:
counting one letter among others is the skill the family tests.
"""

from __future__ import annotations

import random
import re

from agent_trainer.evaluation.families.base import Example, GroupedFamily

_PROMPT = re.compile(r"count: ([a-z]) in ([a-z]+) =")


class CountChar(GroupedFamily):
    name = "count_char"
    version = 1
    instruction = (
        "Train the model to count how often a letter occurs in a short string. Prompts look like "
        "'count: x in jxqxxq =' and the answer is the count, e.g. '3'."
    )
    scorer = "numeric"
    max_new_tokens = 3
    notes = "Single-digit answers: the reward is dense enough for GRPO on its own."
    # Letters that English text never pairs, so the tokenizer keeps one token per letter; three
    # letters over 5-10 characters spread the counts so that always guessing the commonest wins < 30%.
    alphabet = "jqx"
    min_len, max_len = 5, 10

    def split_key(self, prompt: str) -> str:
        """The letter and the string's letters sorted: ``count: x in jxqxxq =`` -> ``count: x in jqqxxx =``; a prompt
        of another shape keys on itself."""
        m = _PROMPT.fullmatch(prompt)
        return f"count: {m[1]} in {''.join(sorted(m[2]))} =" if m else prompt

    def _sample(self, rng: random.Random) -> Example:
        text = "".join(rng.choice(self.alphabet) for _ in range(rng.randint(self.min_len, self.max_len)))
        letter = rng.choice(self.alphabet)
        return Example(prompt=f"count: {letter} in {text} =", answer=str(text.count(letter)))
