"""count_char: count a letter in a short string, e.g. ``count: x in jxqxxq =`` -> ``3``."""

from __future__ import annotations

import random

from agent_trainer.evaluation.families.base import Example, TaskFamily


class CountChar(TaskFamily):
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

    def _sample(self, rng: random.Random) -> Example:
        text = "".join(rng.choice(self.alphabet) for _ in range(rng.randint(self.min_len, self.max_len)))
        letter = rng.choice(self.alphabet)
        return Example(prompt=f"count: {letter} in {text} =", answer=str(text.count(letter)))
