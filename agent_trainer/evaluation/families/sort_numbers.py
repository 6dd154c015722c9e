"""sort_numbers: sort a few small integers ascending, e.g. ``sort: 5 2 9 =`` -> ``2 5 9``.

The split keys on the multiset of numbers (``split_key``, ``GroupedFamily``): no permutation of a hidden item is a
training item.
"""

from __future__ import annotations

import random
import re

from agent_trainer.evaluation.families.base import Example, GroupedFamily

_PROMPT = re.compile(r"sort: (\d+(?: \d+)*) =")


class SortNumbers(GroupedFamily):
    name = "sort_numbers"
    version = 1
    instruction = (
        "Train the model to sort small integers in ascending order. Prompts look like "
        "'sort: 5 2 9 =' and the answer lists the numbers separated by single spaces, e.g. '2 5 9'."
    )
    scorer = "exact"
    max_new_tokens = 12
    notes = "Exact match over several numbers: partial credit rewards help GRPO."
    max_value = 20
    min_count, max_count = 3, 4

    def split_key(self, prompt: str) -> str:
        """The numbers in ascending order (the answer): ``sort: 9 2 5 =`` -> ``sort: 2 5 9 =``; a prompt of another
        shape keys on itself."""
        m = _PROMPT.fullmatch(prompt)
        return "sort: " + " ".join(map(str, sorted(map(int, m[1].split())))) + " =" if m else prompt

    def _sample(self, rng: random.Random) -> Example:
        nums = [rng.randint(0, self.max_value) for _ in range(rng.randint(self.min_count, self.max_count))]
        return Example(prompt="sort: " + " ".join(map(str, nums)) + " =", answer=" ".join(map(str, sorted(nums))))
