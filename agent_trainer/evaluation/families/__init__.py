"""Registry of task families (versioned, declarative, like lm-evaluation-harness tasks).

    >>> from agent_trainer.evaluation.families import get_family
    >>> get_family("calc_chain").training_examples(seed=1, n=2)

The six built-in families are classes in this package. More come from data: every ``*.yaml`` card
in the folders of ``task.include_path`` (exported as ``AGENT_TRAINER_INCLUDE_PATH``) is a family
(``agent_trainer.evaluation.families.data_family``), found without editing the package.
"""

from __future__ import annotations

import os

from agent_trainer.registry import INCLUDE_PATH_ENV, Registry

from agent_trainer.evaluation.families.base import (
    HIDDEN_SEED_BASE,
    MAX_AGENT_SEED,
    SCORERS,
    CardError,
    Example,
    FamilyError,
    TaskFamily,
    extract_answer,
    in_hidden_pool,
    normalize,
)
from agent_trainer.evaluation.families.calc_chain import CalcChain
from agent_trainer.evaluation.families.count_char import CountChar
from agent_trainer.evaluation.families.reverse_text import ReverseText
from agent_trainer.evaluation.families.sort_numbers import SortNumbers
from agent_trainer.evaluation.families.triage import Triage
from agent_trainer.evaluation.families.unit_convert import UnitConvert

FAMILIES: Registry[type[TaskFamily]] = Registry(
    "task family", error=FamilyError, hint="a data family joins with task.include_path=[<folder with its .yaml>]")
for _cls in (CalcChain, ReverseText, SortNumbers, UnitConvert, CountChar, Triage):
    FAMILIES.register(_cls.name, _cls)
BUILT_IN = frozenset(FAMILIES)


def _include_path() -> tuple[str, ...]:
    return tuple(p for p in os.environ.get(INCLUDE_PATH_ENV, "").split(os.pathsep) if p)


def _load_data_families(registry: Registry, include_path: tuple[str, ...]) -> None:
    from agent_trainer.evaluation.families.data_family import cards_on, load_card

    for name in _DATA_FAMILIES:
        registry.unregister(name)
    _DATA_FAMILIES.clear()
    for card in cards_on(list(include_path)):
        cls = load_card(card)
        if cls.name in BUILT_IN:
            raise CardError(f"family card {card}: {cls.name!r} is a built-in family; pick another name")
        registry.register(cls.name, cls)
        _DATA_FAMILIES.append(cls.name)


_DATA_FAMILIES: list[str] = []
FAMILIES.add_loader(_include_path, _load_data_families)


def family_names(include_held_out: bool = True) -> list[str]:
    """Registered family names, optionally without the held-out ones."""
    return [n for n, c in FAMILIES.items() if include_held_out or not c.held_out]


def get_family(name: str, version: int | None = None) -> TaskFamily:
    """The family called ``name``; raises with the known names when it does not exist."""
    cls = FAMILIES[name]
    if version is not None and version != cls.version:
        raise FamilyError(
            f"family {name!r} has version {cls.version}, not {version}; set version: {cls.version} in the task spec"
        )
    return cls()


__all__ = [
    "FAMILIES", "CardError", "Example", "FamilyError", "TaskFamily", "get_family", "family_names", "in_hidden_pool",
    "normalize", "extract_answer", "SCORERS", "MAX_AGENT_SEED", "HIDDEN_SEED_BASE",
]
