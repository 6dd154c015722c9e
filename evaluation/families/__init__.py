"""Registry of task families (versioned, declarative, like lm-evaluation-harness tasks).

    >>> from evaluation.families import get_family
    >>> get_family("calc_chain").training_examples(seed=1, n=2)
"""

from __future__ import annotations

from evaluation.families.base import (
    HIDDEN_SEED_BASE,
    MAX_AGENT_SEED,
    SCORERS,
    Example,
    FamilyError,
    TaskFamily,
    extract_answer,
    in_hidden_pool,
    normalize,
)
from evaluation.families.calc_chain import CalcChain
from evaluation.families.count_char import CountChar
from evaluation.families.reverse_text import ReverseText
from evaluation.families.sort_numbers import SortNumbers
from evaluation.families.triage import Triage
from evaluation.families.unit_convert import UnitConvert

FAMILIES: dict[str, type[TaskFamily]] = {
    cls.name: cls for cls in (CalcChain, ReverseText, SortNumbers, UnitConvert, CountChar, Triage)
}


def family_names(include_held_out: bool = True) -> list[str]:
    """Registered family names, optionally without the held-out ones."""
    return [n for n, c in FAMILIES.items() if include_held_out or not c.held_out]


def get_family(name: str, version: int | None = None) -> TaskFamily:
    """The family called ``name``; raises with the known names when it does not exist."""
    cls = FAMILIES.get(name)
    if cls is None:
        raise FamilyError(f"unknown task family {name!r}; known families: {', '.join(sorted(FAMILIES))}")
    if version is not None and version != cls.version:
        raise FamilyError(
            f"family {name!r} has version {cls.version}, not {version}; set version: {cls.version} in the task spec"
        )
    return cls()


__all__ = [
    "FAMILIES", "Example", "FamilyError", "TaskFamily", "get_family", "family_names", "in_hidden_pool",
    "normalize", "extract_answer", "SCORERS", "MAX_AGENT_SEED", "HIDDEN_SEED_BASE",
]
