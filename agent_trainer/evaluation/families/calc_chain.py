"""calc_chain: chained integer addition and subtraction, e.g. ``calc: 12+7-3=`` -> ``16``.

The split keys on the multiset of signed terms (``split_key``, ``GroupedFamily``): a training item is never a reordering
of a hidden one (``calc: 3+12-7=`` is not trained on when ``calc: 12+3-7=`` is hidden).
"""

from __future__ import annotations

import random
import re

from agent_trainer.evaluation.families.base import Example, GroupedFamily

_PROMPT = re.compile(r"calc: (\d+)((?:[+-]\d+)*)=")
_TERM = re.compile(r"([+-])(\d+)")


class CalcChain(GroupedFamily):
    name = "calc_chain"
    version = 1
    instruction = (
        "Train the model to evaluate chained integer additions and subtractions. "
        "Prompts look like 'calc: 12+7-3=' and the answer is the integer result, e.g. '16'."
    )
    scorer = "numeric"
    max_new_tokens = 6
    notes = "Numeric answers: a partial 'numeric closeness' reward helps GRPO; SFT on curated data is strong."
    # Operands up to 12 keep chains learnable by the tiny models (9,126 distinct prompts: 581 hidden, 4,496 training).
    max_operand = 12
    min_terms, max_terms = 2, 3

    def split_key(self, prompt: str) -> str:
        """The item's terms with their signs, largest first (a zero has no sign): ``calc: 3-7+12=`` ->
        ``calc: 12+3-7=``, the same for every reordering of the same terms (one value) and itself a prompt of the
        family. A prompt of another shape keys on itself."""
        m = _PROMPT.fullmatch(prompt)
        if not m:
            return prompt
        terms = sorted([int(m[1])] + [int(t) if op == "+" else -int(t) for op, t in _TERM.findall(m[2])], reverse=True)
        return f"calc: {terms[0]}" + "".join(f"{t:+d}" for t in terms[1:]) + "="

    def _sample(self, rng: random.Random) -> Example:
        terms = [rng.randint(0, self.max_operand) for _ in range(rng.randint(self.min_terms, self.max_terms))]
        text, value = str(terms[0]), terms[0]
        for t in terms[1:]:
            op = rng.choice("+-")
            text += f"{op}{t}"
            value = value + t if op == "+" else value - t
        return Example(prompt=f"calc: {text}=", answer=str(value))
