"""reverse_text: spell a short lowercase word backwards, e.g. ``reverse: cat =`` -> ``tac``."""

from __future__ import annotations

import random
import string

from agent_trainer.evaluation.families.base import Example, TaskFamily


class ReverseText(TaskFamily):
    name = "reverse_text"
    version = 1
    instruction = (
        "Train the model to reverse a short lowercase word. Prompts look like 'reverse: cat =' "
        "and the answer is the reversed word, e.g. 'tac'."
    )
    scorer = "exact"
    max_new_tokens = 8
    notes = "Copy-like structure: SFT on curated pairs learns it fastest."
    alphabet = string.ascii_lowercase[:12]
    min_len, max_len = 2, 4

    def _sample(self, rng: random.Random) -> Example:
        word = "".join(rng.choice(self.alphabet) for _ in range(rng.randint(self.min_len, self.max_len)))
        return Example(prompt=f"reverse: {word} =", answer=word[::-1])
