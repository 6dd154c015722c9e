"""calc_chain: chained integer addition and subtraction, e.g. ``calc: 12+7-3=`` -> ``16``."""

from __future__ import annotations

import random

from agent_trainer.evaluation.families.base import Example, TaskFamily


class CalcChain(TaskFamily):
    name = "calc_chain"
    version = 1
    instruction = (
        "Train the model to evaluate chained integer additions and subtractions. "
        "Prompts look like 'calc: 12+7-3=' and the answer is the integer result, e.g. '16'."
    )
    scorer = "numeric"
    max_new_tokens = 6
    notes = "Numeric answers: a partial 'numeric closeness' reward helps GRPO; SFT on curated data is strong."
    # Operands up to 12 keep chains learnable by the tiny models (~9k distinct prompts, ~1.1k hidden).
    max_operand = 12
    min_terms, max_terms = 2, 3

    def _sample(self, rng: random.Random) -> Example:
        terms = [rng.randint(0, self.max_operand) for _ in range(rng.randint(self.min_terms, self.max_terms))]
        text, value = str(terms[0]), terms[0]
        for t in terms[1:]:
            op = rng.choice("+-")
            text += f"{op}{t}"
            value = value + t if op == "+" else value - t
        return Example(prompt=f"calc: {text}=", answer=str(value))
