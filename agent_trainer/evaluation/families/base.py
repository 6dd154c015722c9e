"""Task family base class: a versioned, declarative task with training generators and a hidden set.

A family draws items from a seeded generator. Every prompt is assigned to one of two disjoint
pools by a hash of its *split key*: the *hidden* pool (about 1 in ``HIDDEN_BUCKETS``) and the
*training* pool. The split key (``TaskFamily.split_key``) is the same for an item's twins (a data family's prompts
equal after folding; a generated family's reorderings with the same answer, ``GroupedFamily``), so a twin never sits
in the pool opposite its sibling; an item without twins keys on its own prompt.
Agent-facing generators (``training_examples``) only ever return training-pool
items and only accept seeds below ``MAX_AGENT_SEED``; the hidden set is drawn from seeds at
``HIDDEN_SEED_BASE`` and above and keeps hidden-pool items only. So no seed an agent can pass
reaches a hidden item, and disjointness holds by construction (a test checks it too).

Only the ``evaluation`` package reads hidden sets (``agent_trainer.evaluation.hidden_eval``).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Callable, ClassVar

MAX_AGENT_SEED = 1_000_000
HIDDEN_SEED_BASE = 1_000_000_007
HIDDEN_BUCKETS = 8
# A grouped family's groups are on the hidden side 1 in GROUP_SIDES times (GroupedFamily).
GROUP_SIDES = 2


@dataclass(frozen=True)
class Example:
    """One item: the text the model sees and the reference answer it should produce."""

    prompt: str
    answer: str

    def as_dict(self) -> dict[str, str]:
        return {"prompt": self.prompt, "answer": self.answer}


def in_hidden_pool(family: str, prompt: str) -> bool:
    """True when ``prompt`` falls in the family's hidden buckets (1 in ``HIDDEN_BUCKETS``; stable across runs and
    machines). A family's ``in_hidden`` says which items are hidden: this hash of its split key, or for a
    ``GroupedFamily`` this hash of the prompt and its group's side."""
    return _bucket(f"{family}\x00{prompt}", HIDDEN_BUCKETS)


def on_hidden_side(family: str, key: str) -> bool:
    """True when a grouped family's group ``key`` is on the hidden side (1 in ``GROUP_SIDES``)."""
    return _bucket(f"{family}\x00group\x00{key}", GROUP_SIDES)


def _bucket(text: str, buckets: int) -> bool:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % buckets == 0


def normalize(text: str) -> str:
    """Canonical form used for exact match and contamination checks: stripped, single-spaced, lowercase."""
    return " ".join(text.strip().split()).lower()


class FamilyError(ValueError):
    """Raised for a bad request to a family (bad seed, bad size); the message says what to change."""


class CardError(FamilyError):
    """A data family's card or data file on ``task.include_path`` is broken: the card's fault, never that of the
    task spec whose validation happened to load it."""


@dataclass
class TaskFamily:
    """A task family: subclasses set the class attributes and implement ``_sample``."""

    name: ClassVar[str]
    version: ClassVar[int] = 1
    instruction: ClassVar[str]
    # How the harness scores a completion: "exact", "numeric" or "label".
    scorer: ClassVar[str] = "exact"
    # Longest answer in tokens the hidden evaluation lets a model generate.
    max_new_tokens: ClassVar[int] = 8
    held_out: ClassVar[bool] = False
    # Labels for label-scored families (listed to the agent, used by the scorer).
    labels: ClassVar[tuple[str, ...]] = ()
    # A note on the family (part of the tokenizer's corpus: agent_trainer.inner_loop.models.tokenizer).
    notes: ClassVar[str] = ""
    # How the hidden/training split is made, when not by the hash of ``split_key`` (part of the baseline cache's key).
    split: ClassVar[str] = ""

    extra: dict = field(default_factory=dict)

    # --- to implement ---------------------------------------------------------------------
    def _sample(self, rng: random.Random) -> Example:  # pragma: no cover - abstract
        raise NotImplementedError

    # --- public API -----------------------------------------------------------------------
    def split_key(self, prompt: str) -> str:
        """The text the hidden/training split hashes for ``prompt``: one key for an item and its twins (here the
        prompt itself; a data family keys a group of twins on its lexicographically first member, so an item
        without twins keeps the split it always had)."""
        return prompt

    def in_hidden(self, prompt: str) -> bool:
        """True when ``prompt`` belongs to the family's hidden pool (``in_hidden_pool`` of its ``split_key``)."""
        return in_hidden_pool(self.name, self.split_key(prompt))

    def in_training(self, prompt: str) -> bool:
        """True when ``prompt`` belongs to the family's training pool (here: every item not hidden)."""
        return not self.in_hidden(prompt)

    def training_examples(self, seed: int, n: int) -> list[Example]:
        """``n`` training-pool items drawn from ``seed`` (0 <= seed < MAX_AGENT_SEED)."""
        if not isinstance(seed, int) or not 0 <= seed < MAX_AGENT_SEED:
            raise FamilyError(
                f"seed must be an integer in [0, {MAX_AGENT_SEED}), got {seed!r}; pick any seed in that range"
            )
        if not isinstance(n, int) or not 1 <= n <= 100_000:
            raise FamilyError(f"n must be an integer in [1, 100000], got {n!r}")
        return self._draw(seed, n, hidden=False)

    def training_stream(self, seed: int):
        """The training-pool items of ``seed`` one at a time, without end: the first ``n`` are
        ``training_examples(seed, n)`` (for builds that decide how much of a family they need as they go)."""
        if not isinstance(seed, int) or not 0 <= seed < MAX_AGENT_SEED:
            raise FamilyError(
                f"seed must be an integer in [0, {MAX_AGENT_SEED}), got {seed!r}; pick any seed in that range"
            )
        rng = random.Random(f"{self.name}/v{self.version}/{seed}")
        while True:
            ex = self._sample(rng)
            if self.in_training(ex.prompt):
                yield ex

    def pretraining_stream(self, seed: int):
        """The items the shipped tokenizer's corpus and base models were built from (``models.build``): here the
        training stream."""
        return self.training_stream(seed)

    def _draw(self, seed: int, n: int, hidden: bool, salt: str = "") -> list[Example]:
        # ``salt`` (``agent_trainer.salt``; hidden draws only) picks other items of the same pool.
        rng = random.Random(f"{self.name}/v{self.version}/{seed}" + (f"/{salt}" if salt else ""))
        out: list[Example] = []
        seen: set[str] = set()
        attempts = 0
        while len(out) < n:
            attempts += 1
            if attempts > 400 * n + 10_000:
                raise FamilyError(f"family {self.name} could not draw {n} distinct items")
            ex = self._sample(rng)
            if not (self.in_hidden(ex.prompt) if hidden else self.in_training(ex.prompt)):
                continue
            # Training draws may repeat prompts (like sampling with replacement); hidden sets may not.
            if hidden:
                if ex.prompt in seen:
                    continue
                seen.add(ex.prompt)
            out.append(ex)
        return out

    def score_one(self, completion: str, answer: str) -> float:
        """Score one completion against its reference answer, in [0, 1]."""
        return SCORERS[self.scorer](completion, answer)

    def describe(self) -> dict:
        """What an agent may know about the family (never the hidden set)."""
        return {
            "family": self.name,
            "version": self.version,
            "instruction": self.instruction,
            "scorer": self.scorer,
            "labels": list(self.labels),
            "example": self.training_examples(seed=0, n=1)[0].as_dict(),
            "held_out": self.held_out,
        }


class GroupedFamily(TaskFamily):
    """A generated family whose items have twins: the same tokens in another order with the same answer
    (``split_key`` maps a group of twins to one key: calc_chain's signed terms, sort_numbers' numbers, count_char's
    letters). An item is hidden when its own prompt falls in the hidden buckets (``in_hidden_pool``, the split every
    family has) and its group is on the hidden side (``on_hidden_side``, 1 in ``GROUP_SIDES``); it is a training item
    when its group is on the training side, whatever its prompt; the hidden side's other items are in neither pool.

    So no training item is a twin of a hidden one; every hidden item falls in the hidden buckets, so the shipped base
    models, pretrained on training-pool items when the split hashed prompts alone, never saw one (measured: tiny-m
    scores 0.185 on calc_chain items it was pretrained on against 0.118 on unseen ones); and both pools keep the
    generator's mix of items. Keying the whole group on one hash would instead fill the hidden set from a few large
    groups (count_char: 94 groups, half of its hidden items answering 3). The price: the training pool is half the
    groups (calc_chain ~4,500 of 9,126 prompts, sort_numbers and count_char far more than any job reads).
    """

    split = "grouped"

    def in_hidden(self, prompt: str) -> bool:
        return in_hidden_pool(self.name, prompt) and on_hidden_side(self.name, self.split_key(prompt))

    def in_training(self, prompt: str) -> bool:
        return not on_hidden_side(self.name, self.split_key(prompt))

    def pretraining_stream(self, seed: int):
        """The items of ``seed`` outside the hidden buckets, one at a time: the training stream of the split that hashed
        prompts alone, which the shipped tokenizer and base models were built from (so they rebuild the same). Never a
        hidden item; a hidden item's twins are among them (the shipped models saw some, as before)."""
        rng = random.Random(f"{self.name}/v{self.version}/{seed}")
        while True:
            ex = self._sample(rng)
            if not in_hidden_pool(self.name, ex.prompt):
                yield ex


# --- scorers ------------------------------------------------------------------------------


def extract_answer(completion: str) -> str:
    """The answer part of a completion: up to the first newline, stripped."""
    return completion.strip().split("\n", 1)[0].strip()


def _parse_number(text: str) -> float | None:
    token = extract_answer(text).split(" ")[0] if extract_answer(text) else ""
    try:
        return float(token)
    except ValueError:
        return None


def exact_match(completion: str, answer: str) -> float:
    """1.0 when the extracted answer equals the reference after normalisation."""
    return float(normalize(extract_answer(completion)) == normalize(answer))


def numeric_match(completion: str, answer: str, rel_tol: float = 1e-6) -> float:
    """1.0 when the first number of the completion equals the reference number (tiny tolerance)."""
    got, want = _parse_number(completion), _parse_number(answer)
    if got is None or want is None:
        return 0.0
    return float(abs(got - want) <= rel_tol * max(1.0, abs(want)))


def label_match(completion: str, answer: str) -> float:
    """1.0 when the first word of the completion is the reference label (case-insensitive)."""
    words = extract_answer(completion).split()
    return float(bool(words) and words[0].lower().strip(".,:;!") == answer.lower())


SCORERS: dict[str, Callable[[str, str], float]] = {
    "exact": exact_match,
    "numeric": numeric_match,
    "label": label_match,
}
