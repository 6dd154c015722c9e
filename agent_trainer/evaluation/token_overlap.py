"""Contamination judged on the base model's own token ids: would the model read a hidden item in these rows?

    judge = TokenJudge(tokenizer, hidden_prompts, public=training_prompts, fmt=PromptFormat("chat", system))
    judge.scan(["xcalc: 11-3-3=5", ...])    # [(text index, "token", item index), ...] per text
    judge.spread_hits()                      # [("token-spread", item)]: items whose pieces the texts spread out

The character rule (``agent_trainer.evaluation.contamination``) guesses where a tokenizer splits; every round of
red-teaming found glue it guessed wrong (a letter glued to ``calc``: the BPE splits ``x`` off and the model reads the
hidden prompt's exact ids). This judge asks the tokenizer itself:

- a text and a hidden item are tokenized by the job's base model, the item as it sits in the rendered prompt (the
  job's prompt format, chat template included; only the item's own tokens count, never the template's);
- each token id maps to a *key*: its text folded (``fold.fold``: case, Unicode look-alikes) with the
  whitespace removed, so ids the model reads as the same word with other spacing (``" calc"``, ``"calc"``) are one
  key, and pure-whitespace ids (which carry no content) are dropped;
- **near**: a text hits an item when it holds at least ``THETA`` of the item's ``K``-grams of keys. Glue the tokenizer
  splits off in front of or behind the item leaves every gram intact; a long item keeps most of its grams with a few
  tokens inserted, removed or changed. Found with a prefix filter (each item is indexed by the rarest grams it
  cannot do without), then checked with one set intersection: linear in the texts' tokens, no pairwise alignment;
- **spread**: over all texts together, an item whose *distinctive* ``SPREAD_K``-grams (not in the family's public
  training prompts) cover at least ``SPREAD_MIN`` of its tokens: an item cut into pieces, one piece a row.

``THETA`` is set so that no clean training row of a built-in family is flagged (what this misses: docs/security.md;
the counts: docs/results/2026-12-07-red-team-rounds.md).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from typing import Iterable, Sequence

from agent_trainer.evaluation.fold import fold
from agent_trainer.evaluation.prompts import RAW, PromptFormat, render

K = 3                 # gram length of the near rule
THETA = 0.9           # share of a long item's grams, in order, a text must hold (chosen as the docstring says)
SPREAD_K = 6          # gram length of a piece of an item spread over texts (distinctive even in a small vocabulary)
SPREAD_MIN = 0.6      # share of an item's tokens its distinctive pieces must cover, over all texts
SPREAD_MIN_GRAMS = 4  # an item with fewer distinctive grams is too short to be found in pieces
NEAR_MIN_GRAMS = 20   # a shorter item counts only when contained whole: one token changed is another clean item
DRIFT = 0.1           # tokens inserted or removed, as a share of the item, that a near match may shift by
MIN_CORE = 3         # an item of fewer inner tokens must be contained whole
GLUE_TOKENS = 4       # tokens on either side of an item's core whose text may hold its first or last token
MAX_POSITIONS = 64    # where a gram occurs in one text: the first 64 (bounds the work on a text of one gram repeated)
SPACE = 0             # the key of every whitespace-only token
# Trainers cut a sequence at 512 tokens (inner_loop.spec.cost.MAX_SEQUENCE_TOKENS); four times that leaves room for a
# chat template and keeps a text's work bounded however long the agent made it.
MAX_TEXT_TOKENS = 2048
BATCH = 256


@functools.lru_cache(maxsize=4)
def token_keys(tokenizer) -> tuple[tuple[int, ...], int, tuple[str, ...]]:
    """``(key of every token id, longest token in characters, text of every key)``: ids whose folded text without
    whitespace is the same share a key (a small int); every id that is only whitespace has key ``SPACE`` (0)."""
    size = len(tokenizer)
    texts = tokenizer.batch_decode([[i] for i in range(size)])
    pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
    ids: dict[str, int] = {"": SPACE}
    out = []
    for text, piece in zip(texts, pieces):
        # A lone byte of a multi-byte character decodes to U+FFFD: its own piece keeps it apart from other bytes.
        key = "\x00" + str(piece) if "\ufffd" in text else "".join(fold(text).split())
        out.append(ids.setdefault(key, len(ids)))
    return tuple(out), max(1, max((len(t) for t in texts), default=1)), tuple(ids)


def _keys(ids: Sequence[int], table: Sequence[int]) -> list[int]:
    """Keys of ``ids`` with runs of whitespace-only ids as one ``SPACE`` (a space between two numbers is content:
    ``5 10`` is not ``51 0``; how much whitespace, and in which ids, is not)."""
    out: list[int] = []
    for i in ids:
        k = table[i]
        if k != SPACE or (out and out[-1] != SPACE):
            out.append(k)
    return out


def _grams(keys: Sequence[int], n: int) -> list[tuple[int, ...]]:
    if len(keys) < n:
        return [tuple(keys)] if keys else []
    return list(zip(*(keys[i:] for i in range(n))))


def _until_space(keys: Sequence[int]) -> list[int]:
    """``keys`` up to the first whitespace token."""
    out = []
    for k in keys:
        if k == SPACE:
            break
        out.append(k)
    return out


def _as_text(keys: Sequence[int]) -> str:
    """Keys as a string, so that contiguous containment is one ``in`` (done in C)."""
    return "".join(map(chr, keys))


class TokenJudge:
    """Hidden items as key sequences of one tokenizer and prompt format, indexed for ``scan``."""

    def __init__(self, tokenizer, prompts: Sequence[str], public: Iterable[str] = (), fmt: PromptFormat = RAW):
        self.tokenizer = tokenizer
        self.table, longest, self.key_text = token_keys(tokenizer)
        self.max_chars = MAX_TEXT_TOKENS * longest
        # Each item twice: as it starts the rendered prompt, and after a space (where a BPE may split its first word
        # otherwise: "o" "ver" at the start, " over" inside a text). ``owner`` maps a variant to its item.
        self.items = [self._item_keys(p, fmt) for p in prompts] + [self._item_keys(" " + p, RAW) for p in prompts]
        self.owner = [*range(len(prompts)), *range(len(prompts))]
        if fmt.kind != "raw":  # an item the template itself shows (an instruction's example) is public, not a hit
            template = _as_text(next(iter(self._keys_of([render(tokenizer, "", fmt)]))))
            self.items = [[] if _as_text(k) in template else k for k in self.items]
        # The item's inner keys: glue the tokenizer merges into the first or last token changes only that token.
        self.cores = [_as_text(k[1:-1]) if len(k) >= MIN_CORE + 2 else _as_text(k) for k in self.items]
        self.grams = [_grams(k, K) for k in self.items]
        self.lengths = {min(K, len(k)) for k in self.items if k}
        df = Counter(g for gs in self.grams for g in set(gs))
        self.posting: dict[tuple[int, ...], list[int]] = {}
        for j, gs in enumerate(self.grams):
            # A text holding the item's core holds its rarest core gram (the end tokens may be merged with glue).
            core = _grams(self.items[j][1:-1], K) if len(self.cores[j]) < len(self.items[j]) else gs
            if core:
                self.posting.setdefault(min(core, key=lambda g: (df[g], g)), []).append(j)
            if len(gs) >= NEAR_MIN_GRAMS:
                # Prefix filter: a text holding THETA of the item's grams holds one of its len - need + 1 rarest.
                distinct = sorted(set(gs), key=lambda g: (df[g], g))
                for g in distinct[: len(distinct) - math.ceil(THETA * len(distinct)) + 1]:
                    self.posting.setdefault(g, []).append(j)
        seen: set[tuple[int, ...]] = set()
        for keys in self._keys_of(list(public)):
            seen.update(_grams(keys, SPREAD_K))
        self.pieces: dict[tuple[int, ...], list[int]] = {}
        for j, keys in enumerate(self.items):
            own = {g for g in _grams(keys, SPREAD_K) if len(g) == SPREAD_K} - seen
            if len(own) >= SPREAD_MIN_GRAMS:
                for g in own:
                    self.pieces.setdefault(g, []).append(j)
        self.found_pieces: dict[int, set[tuple[int, ...]]] = {}

    def _item_keys(self, prompt: str, fmt: PromptFormat) -> list[int]:
        """The keys of the tokens that cover ``prompt`` where the rendered prompt (template included) holds it,
        without whitespace at either end (what stands next to the item is not the item)."""
        text = render(self.tokenizer, prompt, fmt)
        start = text.rfind(prompt) if fmt.kind != "raw" else 0
        end = start + len(prompt)
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = [i for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]) if a < end and b > start]
        keys = _keys(ids, self.table)
        while keys and keys[-1] == SPACE:
            keys.pop()
        return keys

    def _keys_of(self, texts: list[str]) -> Iterable[list[int]]:
        """Key sequences of ``texts`` (each cut to what a trainer could read), tokenized in batches."""
        for i in range(0, len(texts), BATCH):
            chunk = [t[: self.max_chars] for t in texts[i:i + BATCH]]
            for ids in self.tokenizer(chunk, add_special_tokens=False)["input_ids"]:
                yield _keys(ids[:MAX_TEXT_TOKENS], self.table)

    def matches(self, keys: list[int]) -> dict[int, tuple[str, float]]:
        """``item -> (kind, share of its grams in order)`` for the candidate items of one text: ``token`` when the
        text holds the item's keys contiguously, ``token-near`` when a long item's grams line up at ``THETA`` or more
        (only candidates that share one of their rarest grams with the text are looked at)."""
        at: dict[tuple[int, ...], list[int]] = {}
        for n in self.lengths:
            for q, g in enumerate(_grams(keys, n)):
                where = at.setdefault(g, [])
                if len(where) < MAX_POSITIONS:
                    where.append(q)
        candidates = {j for g in at if g in self.posting for j in self.posting[g]}
        if not candidates:
            return {}
        text, out = _as_text(keys), {}
        for j in candidates:
            if self._contained(j, keys, text):
                out[j] = ("token", 1.0)
            elif len(self.grams[j]) >= NEAR_MIN_GRAMS:
                out[j] = ("token-near", self._aligned(self.grams[j], at))
        return out

    def _contained(self, j: int, keys: list[int], text: str) -> bool:
        """Whether ``keys`` hold item ``j`` contiguously, its first and last token possibly merged with glue: the
        text's tokens up to the core end (with no whitespace token) in the item's first token's text, and those
        after it start with its last token's text (``xtriage:`` read as ``xt`` ``riage`` ``:`` holds ``triage``)."""
        item, core = self.items[j], self.cores[j]
        if len(core) == len(item):
            return core in text
        first, last = self.key_text[item[0]], self.key_text[item[-1]]
        start = text.find(core)
        for _ in range(MAX_POSITIONS):
            if start < 0:
                return False
            end = start + len(core)
            near = _until_space(keys[max(0, start - GLUE_TOKENS):start][::-1])[::-1]
            before = "".join(self.key_text[k] for k in near)
            after = "".join(self.key_text[k] for k in _until_space(keys[end:end + GLUE_TOKENS]))
            if before.endswith(first) and after.startswith(last):
                return True
            start = text.find(core, start + 1)
        return False

    @staticmethod
    def _aligned(grams: list[tuple[int, ...]], at: dict[tuple[int, ...], list[int]]) -> float:
        """Share of the item's grams found at one offset into the text, give or take ``DRIFT`` of the item's length
        (tokens inserted or removed shift the grams after them): in order, so shuffled pieces do not add up."""
        pairs = sorted((q - p, p) for p, g in enumerate(grams) for q in at.get(g, ()))
        drift = int(DRIFT * len(grams))
        best, lo, held = 0, 0, Counter()
        for hi, (d, p) in enumerate(pairs):
            held[p] += 1
            while d - pairs[lo][0] > drift:
                held[pairs[lo][1]] -= 1
                if not held[pairs[lo][1]]:
                    del held[pairs[lo][1]]
                lo += 1
            best = max(best, len(held))
        return best / len(grams)

    def scan(self, texts: list[str]) -> list[tuple[int, str, int]]:
        """``(text index, kind, item)`` for every item a text holds; notes pieces for ``spread_hits``."""
        out = []
        for t, keys in enumerate(self._keys_of(texts)):
            found = {}
            for j, (kind, s) in self.matches(keys).items():
                if s >= THETA:
                    found.setdefault(self.owner[j], kind)
            out += [(t, kind, j) for j, kind in found.items()]
            if self.pieces:
                for g in _grams(keys, SPREAD_K):
                    for j in self.pieces.get(g, ()):
                        self.found_pieces.setdefault(j, set()).add(g)
        return out

    def spread_hits(self) -> list[tuple[str, int]]:
        """Items whose distinctive pieces, over every text scanned so far, cover ``SPREAD_MIN`` of their tokens."""
        out = set()
        for j, found in self.found_pieces.items():
            keys = self.items[j]
            covered = set()
            for i in range(len(keys) - SPREAD_K + 1):
                if tuple(keys[i:i + SPREAD_K]) in found:
                    covered.update(range(i, i + SPREAD_K))
            if len(covered) >= SPREAD_MIN * len(keys):
                out.add(("token-spread", self.owner[j]))
        return sorted(out)
