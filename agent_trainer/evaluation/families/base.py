"""Task family base class: a versioned, declarative task with training generators and a hidden set.

A family draws items from a seeded generator. Every prompt is assigned to one of two disjoint
pools by a hash of its *split key*: the *hidden* pool (about 1 in ``HIDDEN_BUCKETS``) and the
*training* pool. The split key (``TaskFamily.split_key``) is the same for an item's twins (a data family's prompts
equal after folding), so a twin never sits in the other pool; an item without twins keys on its own prompt.
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


@dataclass(frozen=True)
class Example:
    """One item: the text the model sees and the reference answer it should produce."""

    prompt: str
    answer: str

    def as_dict(self) -> dict[str, str]:
        return {"prompt": self.prompt, "answer": self.answer}


def in_hidden_pool(family: str, prompt: str) -> bool:
    """True when ``prompt`` belongs to the family's hidden pool (stable across runs and machines)."""
    digest = hashlib.sha256(f"{family}\x00{prompt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % HIDDEN_BUCKETS == 0


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
            if not self.in_hidden(ex.prompt):
                yield ex

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
            if self.in_hidden(ex.prompt) != hidden:
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
