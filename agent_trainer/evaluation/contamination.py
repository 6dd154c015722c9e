"""Contamination check: does agent-provided text contain items of a family's hidden set?

    r = find_overlap("calc_chain", 200, [("data.jsonl line 1", "calc: 11-3-3="), ("reward.py", source)])
    r.flagged, r.hits, r.to_dict()          # counts and where; never the hidden items themselves

Texts are compared in the model's token space, folded: ``fold`` undoes Unicode disguises (with a cap
on the expanded size, ``MAX_FOLDED_CHARS``), ``units`` splits the folded text where the model's
tokenizer does (every digit and punctuation mark is a token of its own, underscores and spaces are
glue), and a hidden item is hit by an exact, contained, near (glue inserted) or distinctive-piece
match. ``MIN_HITS`` hits flag the texts. The rules, the thresholds and what they miss:
docs/security.md, "Contamination rules".
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Iterable

from agent_trainer.evaluation.fold import (  # noqa: F401 (fold, tokens and units are this module's API too)
    MAX_FOLDED_CHARS, FoldTooLarge, Units, fold, tokens, units)

NGRAM = 8            # runs in a distinctive piece of a long item
MIN_HITS = 1
TEMPLATE_SAMPLE = 10_000
MAX_LISTED = 20
MAX_GLUE = 1.0       # a near match may insert up to this many glue units per unit of the item


def _subsequence_extra(needle: tuple[str, ...], hay: tuple[str, ...], from_left: bool) -> int | None:
    """Units of ``hay`` inside the span that ``needle`` occupies as a subsequence (greedy from one end), or None.

    From the left: the extras before the last matched unit; from the right: those after the first."""
    if not needle:
        return 0
    seq, want = (hay, needle) if from_left else (hay[::-1], needle[::-1])
    k = 0
    for pos, u in enumerate(seq):
        if u == want[k]:
            k += 1
            if k == len(want):
                return pos + 1 - len(want)
    return None


def _ngrams(toks: tuple[str, ...], n: int) -> set[tuple[str, ...]]:
    return {toks[i:i + n] for i in range(len(toks) - n + 1)}


@dataclass
class ContaminationReport:
    """Which agent texts hit which hidden items (by index), and whether the job is flagged."""

    family: str
    n: int
    flagged: bool = False
    hits: int = 0  # distinct hidden items hit
    kinds: dict[str, int] = field(default_factory=lambda: {"exact": 0, "contained": 0, "near": 0, "ngram": 0,
                                                           "token": 0, "token-near": 0, "token-spread": 0})
    sources: list[dict] = field(default_factory=list)  # {"source", "kind", "item"} (first MAX_LISTED)
    texts_checked: int = 0
    error: str = ""  # why the check could not finish (the texts then count as contaminated)

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        """One line for logs and result details."""
        if self.error:
            return f"the contamination check could not finish ({self.error}); the job counts as contaminated"
        if self.kinds.get("undeclared"):
            return ("the model trained on rows that are not the job's declared data: "
                    + "; ".join(s["source"] for s in self.sources if s["kind"] == "undeclared")[:300])
        if not self.flagged:
            return f"no overlap with the {self.n} hidden {self.family} items ({self.texts_checked} texts checked)"
        where = ", ".join(sorted({s["source"] for s in self.sources}))[:300]
        return (f"{self.hits} of the {self.n} hidden {self.family} items occur in the agent's data "
                f"({', '.join(f'{k} {v}' for k, v in self.kinds.items() if v)}): {where}")


class HiddenIndex:
    """The hidden items in units, indexed by their runs for a fast scan of long texts."""

    def __init__(self, prompts: list[str], public: Iterable[str] = ()):
        self.items = [units(p) for p in prompts]
        self.by_runs: dict[tuple[str, ...], list[int]] = {}
        self.by_first: dict[str, set[int]] = {}  # first run -> lengths (in runs) of items starting with it
        self.grams: dict[tuple[str, ...], int] = {}
        long_items = [i for i, u in enumerate(self.items) if len(u.runs) > NGRAM]
        seen: set[tuple[str, ...]] = set()
        if long_items:
            for text in public:
                seen |= _ngrams(units(text).runs, NGRAM)
        for i, u in enumerate(self.items):
            if not u.runs:
                continue
            self.by_runs.setdefault(u.runs, []).append(i)
            self.by_first.setdefault(u.runs[0], set()).add(len(u.runs))
        for i in long_items:
            for g in _ngrams(self.items[i].runs, NGRAM) - seen:
                self.grams.setdefault(g, i)
        self.gram_first = {g[0] for g in self.grams}

    def _near(self, item: Units, text: Units, at: int) -> str | None:
        """How ``item`` occurs in ``text`` with its runs at ``at``: ``exact``/``contained``/``near``, or None."""
        n = len(item.runs)
        extra = 0
        for j in range(1, n):  # between runs: the item's units, in order, with inserted glue
            inner = _subsequence_extra(item.gaps[j], text.gaps[at + j], from_left=True)
            if inner is None:
                return None
            extra += len(text.gaps[at + j]) - len(item.gaps[j])
        head = _subsequence_extra(item.gaps[0], text.gaps[at], from_left=False)
        tail = _subsequence_extra(item.gaps[n], text.gaps[at + n], from_left=True)
        if head is None or tail is None:
            return None
        extra += head + tail
        if extra == 0:
            return "exact" if text.all == item.all else "contained"
        return "near" if extra <= MAX_GLUE * len(item.all) else None

    def scan(self, text: Units) -> list[tuple[str, int]]:
        """``(kind, item index)`` of every hidden item the text hits."""
        found: dict[int, str] = {}
        runs = text.runs
        for i, tok in enumerate(runs):
            for length in self.by_first.get(tok, ()):
                for item in self.by_runs.get(runs[i:i + length], ()):
                    kind = self._near(self.items[item], text, i)
                    if kind and item not in found:
                        found[item] = kind
            if tok in self.gram_first:
                item = self.grams.get(runs[i:i + NGRAM])
                if item is not None:
                    found.setdefault(item, "ngram")
        return [(kind, item) for item, kind in found.items()]


def _index(family: str, n: int) -> HiddenIndex:
    from agent_trainer.salt import hidden_salt

    return _salted_index(family, n, hidden_salt().setting)


@functools.lru_cache(maxsize=16)
def _salted_index(family: str, n: int, salt: str) -> HiddenIndex:
    from agent_trainer.evaluation.families import get_family
    from agent_trainer.evaluation.hidden_eval import hidden_set

    return HiddenIndex([e.prompt for e in hidden_set(family, n, salt)], public_prompts(get_family(family)))


def public_prompts(fam) -> list[str]:
    """The family's public text, whose pieces never count as distinctive: a data family's whole training pool (a
    sample missed ~13% of word_math's rows, and their shared phrases flagged its honest library-only job), else the
    first ``TEMPLATE_SAMPLE`` training items of seed 0."""
    rows = getattr(fam, "rows", None)
    if rows:
        return [r.prompt for r in rows if fam.in_training(r.prompt)]
    return [ex.prompt for ex in fam.training_examples(seed=0, n=TEMPLATE_SAMPLE)]


def _token_judge(family: str, n: int, tokenizer, fmt):
    """The token judge (``agent_trainer.evaluation.token_overlap``) of the family's first ``n`` hidden items."""
    from agent_trainer.evaluation.families import get_family
    from agent_trainer.evaluation.hidden_eval import hidden_set
    from agent_trainer.evaluation.token_overlap import TokenJudge

    return TokenJudge(tokenizer, [e.prompt for e in hidden_set(family, n)], public_prompts(get_family(family)), fmt)


def find_overlap(family: str, n: int, texts: Iterable[tuple[str, str]], min_hits: int = MIN_HITS,
                 tokenizer=None, fmt=None) -> ContaminationReport:
    """Check ``(source label, text)`` pairs against the first ``n`` hidden items of ``family``: the character rule
    first, then (given the base model's ``tokenizer`` and the job's prompt format ``fmt``) the token judge; a
    triple ``(source, text, False)`` is left to the character rule (a field whose row's joined text the judge reads).

    A text too large to fold (``FoldTooLarge``) ends the check with ``error`` set and the report flagged."""
    index = _index(family, int(n))
    judge = None
    if tokenizer is not None:
        from agent_trainer.evaluation.prompts import RAW
        from agent_trainer.evaluation.token_overlap import BATCH

        judge = _token_judge(family, int(n), tokenizer, fmt or RAW)
    report = ContaminationReport(family=family, n=int(n))
    hit_items: set[int] = set()

    def hit(source: str, kind: str, item: int) -> None:
        if item not in hit_items:
            report.kinds[kind] += 1
        hit_items.add(item)
        if len(report.sources) < MAX_LISTED:
            report.sources.append({"source": source, "kind": kind, "item": item})

    batch: list[tuple[str, str]] = []
    for source, text, *token_judged in texts:
        report.texts_checked += 1
        try:
            found = index.scan(units(text))
        except FoldTooLarge as e:
            report.error = f"{source}: {e}"
            report.flagged = True
            return report
        for kind, item in found:
            hit(source, kind, item)
        if judge is not None and (not token_judged or token_judged[0]):
            batch.append((source, text))
            if len(batch) >= BATCH:
                for t, kind, item in judge.scan([x for _, x in batch]):
                    hit(batch[t][0], kind, item)
                batch = []
    if judge is not None:
        for t, kind, item in judge.scan([x for _, x in batch]):
            hit(batch[t][0], kind, item)
        for kind, item in judge.spread_hits():
            hit("pieces over several texts", kind, item)
    report.hits = len(hit_items)
    report.flagged = report.hits >= min_hits
    return report
