"""unit_convert: convert a quantity between metric units, e.g. ``convert: 3 km to m =`` -> ``3000``."""

from __future__ import annotations

import random

from agent_trainer.evaluation.families.base import Example, TaskFamily

# (from, to, factor): value_in_to = value_in_from * factor; integer results only.
CONVERSIONS = [
    ("km", "m", 1000),
    ("m", "cm", 100),
    ("cm", "mm", 10),
    ("kg", "g", 1000),
    ("l", "ml", 1000),
    ("h", "min", 60),
    ("min", "s", 60),
    ("day", "h", 24),
]


class UnitConvert(TaskFamily):
    name = "unit_convert"
    version = 1
    instruction = (
        "Train the model to convert quantities between units. Prompts look like "
        "'convert: 3 km to m =' and the answer is the number in the target unit, e.g. '3000'."
    )
    scorer = "numeric"
    max_new_tokens = 7
    notes = "A lookup of factors plus multiplication: the larger base model has the edge."
    # 400 values x 8 conversions leave ~400 hidden-pool prompts, enough for a 200-item hidden set.
    max_value = 400

    def _sample(self, rng: random.Random) -> Example:
        src, dst, factor = rng.choice(CONVERSIONS)
        value = rng.randint(1, self.max_value)
        return Example(prompt=f"convert: {value} {src} to {dst} =", answer=str(value * factor))
