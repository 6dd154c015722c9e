"""A text as the contamination check compares it: folded (its disguises undone), then split into units.

    fold("Ｃａｌｃ: 11-3-3=")   # -> "calc: 11-3-3="
    tokens("Calc:  11 - 3")     # -> ("calc", ":", "11", "-", "3")

Case, Unicode compatibility forms (NFKD, then NFKC), look-alike characters (Unicode TR39 confusables mapped to
ASCII), invisible and combining marks, and control characters as spaces; a cap on the expanded size
(``MAX_FOLDED_CHARS``, an expansion attack raises ``FoldTooLarge``). Used by the character rule
(``agent_trainer.evaluation.contamination``), the token judge (``agent_trainer.evaluation.token_overlap``) and the
split keys of the families.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

MAX_FOLDED_CHARS = 1_000_000   # a text whose folded form would be longer is refused (FoldTooLarge)
_CHUNK = 4096
# Invisible characters outside the categories folded away (Cf, Mn, Me): Hangul fillers, Braille blank.
_INVISIBLE = frozenset("\u115f\u1160\u3164\uffa0\u2800")
_DROP = frozenset(("Cf", "Mn", "Me"))
_SPACE = frozenset(("Zs", "Zl", "Zp", "Cc"))


class FoldTooLarge(ValueError):
    """A text whose Unicode-normalised form exceeds ``MAX_FOLDED_CHARS`` (an expansion attack)."""


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


class _CharFold(dict):
    """``str.translate`` table of the per-character step of ``fold``, filled on first sight of a character."""

    def __missing__(self, code: int) -> str:
        ch = chr(code)
        cat = unicodedata.category(ch)
        out = ("" if cat in _DROP or ch in _INVISIBLE else " " if cat in _SPACE
               else str(unicodedata.decimal(ch)) if cat == "Nd" else ch)
        self[code] = out
        return out


_CHAR_FOLD = _CharFold()
_ASCII_FOLD = {c: " " for c in (*range(32), 127)}


def fold(text: str, max_chars: int = MAX_FOLDED_CHARS) -> str:
    """``text`` with its disguises undone (see the module docstring): what two texts are compared as.

    Works through the text in chunks and raises ``FoldTooLarge`` as soon as the normalised form
    passes ``max_chars`` (a character such as U+FDFA expands to 18), so memory stays bounded."""
    if len(text) > max_chars:
        raise FoldTooLarge(f"a text of {len(text):,} characters is over the {max_chars:,} the check folds")
    if text.isascii():
        return text.translate(_ASCII_FOLD).lower()
    parts, total = [], 0
    for i in range(0, len(text), _CHUNK):
        part = unicodedata.normalize("NFKD", text[i:i + _CHUNK]).translate(_CHAR_FOLD)
        total += len(part)
        if total > max_chars:
            raise FoldTooLarge(f"a text expands past {max_chars:,} characters under Unicode normalisation")
        parts.append(part)
    # Look-alikes before and after case folding: capital Cyrillic Т looks like T, its small т does not look like t.
    skeleton = _skeleton_map()
    folded = unicodedata.normalize("NFKC", "".join(parts)).translate(skeleton).casefold()
    return folded.translate(skeleton).casefold()


# Units after folding: runs of letters, runs of digits, single punctuation marks ('_' is rewritten first).
_UNIT = re.compile(r"[^\W\d_]+|\d+|[^\w\s]")


@dataclass(frozen=True)
class Units:
    """A folded text in units: ``runs`` (letter and digit runs the comparison anchors on) and, around them,
    ``gaps[j]``: the other units (punctuation, a run glued to a longer run of the other class) before run j
    (``gaps[len(runs)]``: after the last run)."""

    runs: tuple[str, ...]
    gaps: tuple[tuple[str, ...], ...]

    @property
    def all(self) -> tuple[str, ...]:
        """Every unit in order."""
        out: list[str] = []
        for gap, run in zip(self.gaps, self.runs):
            out += [*gap, run]
        return (*out, *self.gaps[-1])


_MIXED = re.compile(r"[^\W\d_]\d|\d[^\W\d_]")
_RUNS = re.compile(r"[^\W_]+")
_MARK = re.compile(r"[^\w\s]")


def _units(folded: str) -> Units:
    folded = folded.replace("_", " ")
    if not _MIXED.search(folded):  # no letter touches a digit: every run is kept (the common case, in C)
        return Units(tuple(_RUNS.findall(folded)), tuple(tuple(_MARK.findall(g)) for g in _RUNS.split(folded)))
    found = [(m.group(), m.start(), m.end()) for m in _UNIT.finditer(folded)]
    keep = [False] * len(found)
    i = 0
    while i < len(found):  # clusters: runs with nothing between them ("7calc", "h2o", "11x")
        j = i
        if found[i][0][0].isalnum():
            while j + 1 < len(found) and found[j + 1][0][0].isalnum() and found[j + 1][1] == found[j][2]:
                j += 1
            cluster = range(i, j + 1)
            letters = max((len(found[k][0]) for k in cluster if not found[k][0][0].isdigit()), default=0)
            digits = max((len(found[k][0]) for k in cluster if found[k][0][0].isdigit()), default=0)
            keep_digits = digits > letters
            for k in cluster:
                keep[k] = found[k][0][0].isdigit() == keep_digits
        i = j + 1
    runs, gaps, gap = [], [], []
    for (u, _, _), kept in zip(found, keep):
        if kept:
            runs.append(u)
            gaps.append(tuple(gap))
            gap = []
        else:
            gap.append(u)
    gaps.append(tuple(gap))
    return Units(tuple(runs), tuple(gaps))


def units(text: str) -> Units:
    """``text`` folded (``fold``) and split into ``Units``."""
    return _units(fold(text))


def tokens(text: str) -> tuple[str, ...]:
    """Folded units of ``text`` in order: letter runs, digit runs and single punctuation marks."""
    return units(text).all
