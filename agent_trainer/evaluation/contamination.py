"""Contamination check: does agent-provided text contain items of a family's hidden set?

    r = find_overlap("calc_chain", 200, [("data.jsonl line 1", "calc: 11-3-3="), ("reward.py", source)])
    r.flagged, r.hits, r.to_dict()          # counts and where; never the hidden items themselves

Texts are folded (``fold``) and tokenized (``tokens``); a hidden item is hit by an exact, contained
or distinctive ``NGRAM``-gram match, and ``MIN_HITS`` hits flag the texts. The rules, the thresholds
and what they miss: docs/security.md, "Contamination rules".
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import asdict, dataclass, field
from typing import Iterable

NGRAM = 13
MIN_HITS = 1
TEMPLATE_SAMPLE = 2000
MAX_LISTED = 20
_TOKEN = re.compile(r"\w+|[^\w\s]")
# Invisible characters outside the categories folded away (Cf, Mn, Me): Hangul fillers, Braille blank.
_INVISIBLE = frozenset("\u115f\u1160\u3164\uffa0\u2800")
_DROP = frozenset(("Cf", "Mn", "Me"))
_SPACE = frozenset(("Zs", "Zl", "Zp", "Cc"))


@functools.lru_cache(maxsize=1)
def _skeleton_map() -> dict[int, str]:
    """Look-alike non-ASCII characters (Unicode TR39 confusables, as shipped by ``confusable_homoglyphs``) -> ASCII.

    Characters confusable with each other form groups; a non-ASCII member maps to the group's
    smallest ASCII letter, else its smallest printable ASCII character (Cyrillic ``а`` -> ``a``,
    Greek ``Ο`` -> ``O``), else to the group's smallest character. ASCII itself is never remapped:
    ``l`` and ``1`` stay apart, so folding never merges two items a model reads differently
    (a test holds that clean rows of every family stay clean)."""
    import json
    from importlib.resources import files

    table = json.loads((files("confusable_homoglyphs") / "confusables.json").read_text(encoding="utf-8"))
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for char, homoglyphs in table.items():
        for h in homoglyphs:
            if len(char) == 1 and len(h["c"]) == 1:
                a, b = find(char), find(h["c"])
                if a != b:
                    parent[a] = b
    groups: dict[str, list[str]] = {}
    for ch in list(parent):
        groups.setdefault(find(ch), []).append(ch)
    out: dict[int, str] = {}
    for members in groups.values():
        ascii_ = [m for m in members if m.isascii() and m.isprintable()]
        rep = min([m for m in ascii_ if m.isalpha()] or ascii_ or members)
        out.update({ord(m): rep for m in members if m != rep and not m.isascii()})
    return out


def fold(text: str) -> str:
    """``text`` with its disguises undone (see the module docstring): what two texts are compared as."""
    chars = []
    for ch in unicodedata.normalize("NFKD", text):
        cat = unicodedata.category(ch)
        if cat in _DROP or ch in _INVISIBLE:
            continue
        chars.append(" " if cat in _SPACE else str(unicodedata.decimal(ch)) if cat == "Nd" else ch)
    # Look-alikes before and after case folding: capital Cyrillic Т looks like T, its small т does not look like t.
    skeleton = _skeleton_map()
    folded = unicodedata.normalize("NFKC", "".join(chars)).translate(skeleton).casefold()
    return folded.translate(skeleton).casefold()


def tokens(text: str) -> tuple[str, ...]:
    """Folded tokens of ``text`` (``fold``): words/numbers and single punctuation marks."""
    return tuple(_TOKEN.findall(fold(text)))


def _ngrams(toks: tuple[str, ...], n: int) -> set[tuple[str, ...]]:
    return {toks[i:i + n] for i in range(len(toks) - n + 1)}


@dataclass
class ContaminationReport:
    """Which agent texts hit which hidden items (by index), and whether the job is flagged."""

    family: str
    n: int
    flagged: bool = False
    hits: int = 0  # distinct hidden items hit
    kinds: dict[str, int] = field(default_factory=lambda: {"exact": 0, "contained": 0, "ngram": 0})
    sources: list[dict] = field(default_factory=list)  # {"source", "kind", "item"} (first MAX_LISTED)
    texts_checked: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        """One line for logs and result details."""
        if self.kinds.get("undeclared"):
            return ("the model trained on rows that are not the job's declared data: "
                    + "; ".join(s["source"] for s in self.sources if s["kind"] == "undeclared")[:300])
        if not self.flagged:
            return f"no overlap with the {self.n} hidden {self.family} items ({self.texts_checked} texts checked)"
        where = ", ".join(sorted({s["source"] for s in self.sources}))[:300]
        return (f"{self.hits} of the {self.n} hidden {self.family} items occur in the agent's data "
                f"({', '.join(f'{k} {v}' for k, v in self.kinds.items() if v)}): {where}")


class _HiddenIndex:
    """Token sequences of the hidden items, indexed by first token for a fast scan of long texts."""

    def __init__(self, family: str, n: int):
        from agent_trainer.evaluation.families import get_family
        from agent_trainer.evaluation.hidden_eval import hidden_set

        items = [tokens(e.prompt) for e in hidden_set(family, n)]
        self.whole: dict[tuple[str, ...], int] = {}
        self.by_first: dict[str, set[int]] = {}  # first token -> lengths of short items starting with it
        self.grams: dict[tuple[str, ...], int] = {}
        public: set[tuple[str, ...]] = set()
        if any(len(t) > NGRAM for t in items):
            for ex in get_family(family).training_examples(seed=0, n=TEMPLATE_SAMPLE):
                public |= _ngrams(tokens(ex.prompt), NGRAM)
        for i, toks in enumerate(items):
            if not toks:
                continue
            self.whole.setdefault(toks, i)
            if len(toks) <= NGRAM:
                self.by_first.setdefault(toks[0], set()).add(len(toks))
            else:
                for g in _ngrams(toks, NGRAM) - public:
                    self.grams.setdefault(g, i)
        self.gram_first = {g[0] for g in self.grams}

    def scan(self, toks: tuple[str, ...]) -> list[tuple[str, int]]:
        """``(kind, item index)`` of every hidden item ``toks`` hits."""
        if toks in self.whole:
            return [("exact", self.whole[toks])]
        found: dict[int, str] = {}
        for i, tok in enumerate(toks):
            for length in self.by_first.get(tok, ()):
                item = self.whole.get(toks[i:i + length])
                if item is not None:
                    found.setdefault(item, "contained")
            if tok in self.gram_first:
                item = self.grams.get(toks[i:i + NGRAM])
                if item is not None:
                    found.setdefault(item, "ngram")
        return [(kind, item) for item, kind in found.items()]


@functools.lru_cache(maxsize=16)
def _index(family: str, n: int) -> _HiddenIndex:
    return _HiddenIndex(family, n)


def find_overlap(family: str, n: int, texts: Iterable[tuple[str, str]],
                 min_hits: int = MIN_HITS) -> ContaminationReport:
    """Check ``(source label, text)`` pairs against the first ``n`` hidden items of ``family``."""
    index = _index(family, int(n))
    report = ContaminationReport(family=family, n=int(n))
    hit_items: set[int] = set()
    for source, text in texts:
        report.texts_checked += 1
        for kind, item in index.scan(tokens(text)):
            if item not in hit_items:
                report.kinds[kind] += 1
            hit_items.add(item)
            if len(report.sources) < MAX_LISTED:
                report.sources.append({"source": source, "kind": kind, "item": item})
    report.hits = len(hit_items)
    report.flagged = report.hits >= min_hits
    return report
