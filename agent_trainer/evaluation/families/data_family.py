"""Task families defined by data: a YAML card and a JSONL of ``{prompt, answer}`` rows, on an include path.

    at-eval task.include_path=[/my/tasks] task=/my/tasks/word_math_task.json

Every folder of ``task.include_path`` is searched for ``*.yaml`` cards when a family is looked up; a
data family then works like a built-in one (the same hash split into a hidden and a training pool). Rows whose
prompts are equal after the folds the contamination check uses (``canonical_prompt``: case, spacing, Unicode
look-alikes) are twins: the card loads with each group merged into its first row (``merged_twins`` counts the
rows dropped), and the group keys the split on its lexicographically first prompt, so a card's twin can never sit
in the training pool while its sibling is hidden (and flag an honest library-only job for the card's fault).
The card's keys and defaults: docs/real_models.md, "A data set as a task family".
"""

from __future__ import annotations

import json
import logging
import random
import re
from pathlib import Path

import yaml

from agent_trainer.evaluation.families.base import (
    SCORERS, CardError, Example, FamilyError, TaskFamily, extract_answer, normalize,
)

CARD_KEYS = {"name", "version", "instruction", "scorer", "answer_regex", "labels", "max_new_tokens", "held_out",
             "data", "notes"}
MAX_ROWS = 1_000_000
# A family with at most this many distinct answers (and no labels) is a classification: its answers are a closed set.
CLOSED_SET_MAX = 32
NAME = re.compile(r"^[a-z][a-z0-9_]*$")
log = logging.getLogger(__name__)


class DataFamily(TaskFamily):
    """A family whose items are the rows of a JSONL file (subclassed per card by ``load_card``)."""

    rows: tuple[Example, ...] = ()
    answer_regex: str | None = None
    source: str = ""
    merged_twins: int = 0                 # rows of the card dropped as twins of an earlier row
    split_keys: dict[str, str] = {}       # a kept row's prompt -> its group's first prompt (only for groups of 2+)

    def split_key(self, prompt: str) -> str:
        return self.split_keys.get(prompt, prompt)

    def _sample(self, rng: random.Random) -> Example:
        return self.rows[rng.randrange(len(self.rows))]

    def _draw(self, seed: int, n: int, hidden: bool, salt: str = "") -> list[Example]:
        pool = [r for r in self.rows if (self.in_hidden(r.prompt) if hidden else self.in_training(r.prompt))]
        if hidden:
            # Distinct prompts, in a fixed shuffled order: the first n are the hidden set of size n.
            pool = list({r.prompt: r for r in pool}.values())
            random.Random(f"{self.name}/v{self.version}/{seed}" + (f"/{salt}" if salt else "")).shuffle(pool)
            if n > len(pool):
                raise FamilyError(f"family {self.name} has {len(pool)} hidden items ({len(self.rows)} rows); "
                                  f"set hidden_eval_size to {len(pool)} or less, or add rows to {self.source}")
            return pool[:n]
        if not pool:
            raise FamilyError(f"family {self.name} has no training rows; add rows to {self.source}")
        rng = random.Random(f"{self.name}/v{self.version}/{seed}")
        return [pool[rng.randrange(len(pool))] for _ in range(n)]

    def score_one(self, completion: str, answer: str) -> float:
        if self.scorer == "regex":
            return regex_match(completion, answer, self.answer_regex or "")
        if self.scorer == "contains":
            return contains_match(completion, answer, self.closed_answers())
        return super().score_one(completion, answer)

    @classmethod
    def closed_answers(cls) -> tuple[str, ...]:
        """The family's answers when they form a closed set (the card's labels, else its distinct answers when
        there are at most ``CLOSED_SET_MAX``), normalised; () for an open set."""
        if "_closed" not in cls.__dict__:
            answers = {normalize(a) for a in cls.labels} or {normalize(r.answer) for r in cls.rows}
            cls._closed = tuple(sorted(a for a in answers if a)) if len(answers) <= CLOSED_SET_MAX else ()
        return cls._closed


def regex_match(completion: str, answer: str, pattern: str) -> float:
    """1.0 when the first match of ``pattern`` in the completion (its first group, if any) equals the answer."""
    m = re.search(pattern, completion)
    if not m:
        return 0.0
    got = m.group(1) if m.groups() else m.group(0)
    return float(normalize(got) == normalize(answer))


def _says(line: str, answer: str) -> bool:
    """Whether ``answer`` occurs in ``line`` as whole words ("5" not in "15", "no" not in "know" or "yesno")."""
    return bool(answer) and re.search(rf"(?<!\w){re.escape(answer)}(?!\w)", line) is not None


def contains_match(completion: str, answer: str, closed: tuple[str, ...] = ()) -> float:
    """1.0 when the answer occurs as whole words in the first line of the completion (case-insensitive) and, for a
    family with a closed set of answers (``closed``), no other of them does but those inside the answer: a line
    naming several labels ("yes or no") is a hedge, not an answer, and scores 0."""
    line, want = normalize(extract_answer(completion)), normalize(answer)
    if not _says(line, want):
        return 0.0
    return float(not any(_says(line, other) and not _says(want, other) for other in closed))


SCORERS.setdefault("contains", contains_match)
DATA_SCORERS = ("exact", "numeric", "label", "contains", "regex")


def load_card(path: str | Path) -> type[DataFamily]:
    """The family class of a YAML card (its JSONL read and checked); ``FamilyError`` says what is wrong."""
    path = Path(path)
    try:
        card = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise CardError(f"family card {path}: cannot be read: {e}") from None
    if not isinstance(card, dict):
        raise CardError(f"family card {path}: expected key: value lines (name, data, scorer, ...)")
    unknown = sorted(set(card) - CARD_KEYS)
    if unknown:
        raise CardError(f"family card {path}: unknown key(s) {unknown}; known: {sorted(CARD_KEYS)}")
    name = card.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise CardError(f"family card {path}: name must be lower-case letters, digits and _, got {name!r}")
    scorer = card.get("scorer", "exact")
    if scorer not in DATA_SCORERS:
        raise CardError(f"family card {path}: scorer {scorer!r} is not one of {', '.join(DATA_SCORERS)}")
    if scorer == "regex":
        try:
            re.compile(str(card.get("answer_regex") or ""))
        except re.error as e:
            raise CardError(f"family card {path}: answer_regex does not compile: {e}") from None
        if not card.get("answer_regex"):
            raise CardError(f"family card {path}: the regex scorer needs answer_regex")
    labels = card.get("labels") or []
    if not isinstance(labels, list) or not all(isinstance(x, (str, int, float)) for x in labels):
        raise CardError(f"family card {path}: labels must be a list such as [refund, bug, other], got {labels!r}")
    data = path.parent / str(card.get("data") or f"{name}.jsonl")
    rows, first_line = _read_rows(data)
    read = len(rows)
    rows, split_keys = merge_twins(rows)
    merged = read - len(rows)
    if merged:
        log.warning("family card %s: %d of its %d rows merged as twins of earlier rows (prompts equal after the "
                    "contamination check's folds)", path, merged, read)
    attrs = {
        "name": name, "version": _card_value(card, path, "version", int, 1),
        "instruction": str(card.get("instruction") or f"Answer the {name} prompt."),
        "scorer": scorer, "answer_regex": card.get("answer_regex"), "labels": tuple(str(x) for x in labels),
        "max_new_tokens": _card_value(card, path, "max_new_tokens", int, 16),
        "held_out": _card_value(card, path, "held_out", bool, False),
        "notes": str(card.get("notes") or ""), "rows": tuple(rows), "source": str(data),
        "merged_twins": merged, "split_keys": split_keys,
    }
    cls = type(f"DataFamily_{name}", (DataFamily,), attrs)
    _check_answers(cls, first_line)
    return cls


def canonical_prompt(prompt: str) -> str:
    """A prompt as the contamination check compares it: folded (case, Unicode look-alikes) and in units, so that
    spacing and glue between units do not count (``Calc:  11 - 3`` is ``calc: 11-3``)."""
    from agent_trainer.evaluation.fold import FoldTooLarge, tokens

    try:
        return "\x1f".join(tokens(prompt))
    except FoldTooLarge:
        return normalize(prompt)


def merge_twins(rows: list[Example]) -> tuple[list[Example], dict[str, str]]:
    """``(rows with each group of twins merged into its first row, kept prompt -> the group's split key)``: the
    split key is the group's lexicographically first prompt, listed only for groups of two or more (a row
    without twins keeps the split of its own prompt)."""
    groups: dict[str, list[Example]] = {}
    for r in rows:
        groups.setdefault(canonical_prompt(r.prompt), []).append(r)
    kept = [g[0] for g in groups.values()]
    keys = {g[0].prompt: min(x.prompt for x in g) for g in groups.values() if len({x.prompt for x in g}) > 1}
    return kept, keys


def _card_value(card: dict, path: Path, key: str, kind: type, default):
    value = card.get(key, default)
    if type(value) is not kind or (kind is int and not 1 <= value <= 100_000):
        what = "true or false" if kind is bool else "a whole number from 1 to 100000"
        raise CardError(f"family card {path}: {key} must be {what}, got {value!r}")
    return value


def _check_answers(cls: type[DataFamily], first_line: dict[str, int]) -> None:
    """Every distinct answer must score 1.0 as its own completion (a ``numeric`` family cannot score "1,000"; a
    ``label`` family's answers are single words among its labels): else no model could score that row."""
    fam, labels = cls(), {normalize(x) for x in cls.labels}
    for answer, line in first_line.items():
        if not answer.strip():
            why = "is empty (an empty completion would score)"
        elif cls.scorer == "label" and labels and normalize(answer) not in labels:
            why = f"is not one of the labels {list(cls.labels)}"
        elif cls.scorer != "regex" and fam.score_one(answer, answer) != 1.0:
            why = {"numeric": "is not a number (write 1000, not 1,000 or $1000)",
                   "label": "is not one word (the label scorer reads the first word)"}.get(
                cls.scorer, "does not score as its own completion (it spans lines)")
        else:
            continue
        other = ", or use scorer: exact" if cls.scorer in ("numeric", "label") else ""
        raise CardError(f"family data {cls.source} line {line}: the answer {answer[:60]!r} {why}; fix the row{other}")


def _read_rows(path: Path) -> tuple[list[Example], dict[str, int]]:
    """The rows of a family's JSONL, and the line each distinct answer first appears on."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise CardError(f"family data {path}: cannot be read: {e}") from None
    rows: list[Example] = []
    first_line: dict[str, int] = {}
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise CardError(f"family data {path} line {n}: not JSON") from None
        if not (isinstance(obj, dict) and isinstance(obj.get("prompt"), str) and isinstance(obj.get("answer"), str)):
            raise CardError(f"family data {path} line {n}: each line needs string prompt and answer")
        rows.append(Example(obj["prompt"], obj["answer"]))
        first_line.setdefault(obj["answer"], n)
        if len(rows) > MAX_ROWS:
            raise CardError(f"family data {path}: more than {MAX_ROWS} rows")
    if not rows:
        raise CardError(f"family data {path}: no rows")
    return rows, first_line


def cards_on(include_path: list[str]) -> list[Path]:
    """The ``*.yaml`` family cards in the include-path folders, in order."""
    out = []
    for folder in include_path:
        p = Path(folder)
        if not p.is_dir():
            raise CardError(f"task.include_path: {folder} is not a folder")
        out += sorted(p.glob("*.yaml"))
    return out
