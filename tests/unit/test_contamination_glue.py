"""Contamination in the model's token space: glue the tokenizer isolates, and splits, hide no hidden item.

A generator writes disguises of every family's hidden prompts: a digit, underscore or punctuation mark
glued to the front or back of words (one glue at the first word, five different ones; at the last; on
every 4th and 5th word), case changes, underscores for spaces, re-spacing, and long items cut into
pieces, one piece a row. None may pass; every family's clean training rows, plain and with the same
disguises, must (the threshold that keeps them so: docs/security.md, "Contamination rules").
"""

from __future__ import annotations

import random
import re

import pytest

from agent_trainer.evaluation.contamination import NGRAM, find_overlap, tokens, units
from agent_trainer.evaluation.families import FAMILIES, get_family
from agent_trainer.evaluation.hidden_eval import hidden_set

N = 200
GLUE_DIGITS = "0123456789"
GLUE_MARKS = "_.,:;!?-'#*~/|"


def _glue_choices(word: str, back: bool) -> str:
    # A digit glued to a number makes another number (a changed item, not glue): digits go on letters only.
    return (GLUE_DIGITS if (word[-1] if back else word[0]).isalpha() else "") + GLUE_MARKS


def glue_disguises(prompt: str, seed: int = 0) -> list[str]:
    """Disguises of ``prompt`` by glue a digit-and-punctuation-isolating tokenizer splits off again."""
    rng = random.Random(f"{seed}/{prompt}")
    words = prompt.split(" ")

    def glued(positions, sides=None) -> str:
        out = list(words)
        for i in positions:
            back = rng.random() < 0.5 if sides is None else sides
            ch = rng.choice(_glue_choices(out[i], back))
            out[i] = out[i] + ch if back else ch + out[i]
        return " ".join(out)

    out = [glued([0], False) for _ in range(5)]
    out.append(glued([len(words) - 1], True))
    out += [glued(range(0, len(words), step)) for step in (5, 4)]
    out.append(rng.choice([str.upper, str.title, str.swapcase])(glued([0], False)))
    out.append(prompt.replace(" ", "_"))
    out.append(prompt.replace(" ", "  ").replace(":", " : "))
    return out


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_glued_hidden_items_are_flagged_and_glued_clean_rows_are_not(family):
    hidden = hidden_set(family, N)
    missed = [d for e in hidden[:60] for d in glue_disguises(e.prompt)
              if not find_overlap(family, N, [("row", d + e.answer)]).flagged]
    assert not missed, f"{len(missed)} glued {family} items passed, e.g. {missed[:3]}"
    clean = get_family(family).training_examples(seed=5, n=2000)
    texts = [(f"clean {i}", e.prompt + e.answer) for i, e in enumerate(clean)]
    texts += [(f"glued clean {i}", d + e.answer) for i, e in enumerate(clean[:200]) for d in glue_disguises(e.prompt)]
    control = find_overlap(family, N, texts)
    assert not control.flagged, f"clean {family} rows flagged: {control.sources[:5]}"


def test_distinctive_pieces_of_long_items_are_flagged_one_piece_a_row():
    """A long item cut into rows: any piece that holds a run of NGRAM words no public item has is found, glued."""
    from agent_trainer.evaluation.contamination import _index

    index = _index("triage", N)
    pieces = {}
    for gram, item in index.grams.items():
        pieces.setdefault(item, gram)
    assert len(pieces) >= 5, "the triage hidden set has long items with distinctive pieces"
    for item, gram in pieces.items():
        prompt = hidden_set("triage", N)[item].prompt
        words = prompt.split(" ")
        ends = [len(units(" ".join(words[:k + 1])).runs) for k in range(len(words))]
        start = next(i for i in range(len(index.items[item].runs)) if index.items[item].runs[i:i + NGRAM] == gram)
        inside = [k for k in range(len(words)) if ends[k] > start and (k == 0 or ends[k - 1] < start + NGRAM)]
        # the words that hold the piece in one row, glued; the rest of the item in another
        head = " ".join(f"_{words[k]}{'7' if words[k][-1].isalpha() else '#'}" if k % 3 == 0 else words[k]
                        for k in inside)
        rest = " ".join(w for k, w in enumerate(words) if k not in inside)
        r = find_overlap("triage", N, [("row 1", "1" + head), ("row 2", rest + "#")])
        assert r.flagged, (prompt, head)


def _tokenizer(name: str):
    if name == "project":
        from agent_trainer.inner_loop.models.tokenizer import build_tokenizer

        return build_tokenizer()
    from transformers import AutoTokenizer

    from agent_trainer.paths import cache_dir

    found = sorted((cache_dir() / "models").glob("smollm2-135m-v*/tokenizer.json"))
    if not found:
        pytest.skip("SmolLM2-135M is not in the model cache (at-models builds it)")
    return AutoTokenizer.from_pretrained(found[-1].parent, local_files_only=True)


@pytest.mark.parametrize("name", ["project", "smollm2"])
def test_units_never_cut_inside_a_token_of_the_base_models_tokenizers(name):
    """No token the base models' tokenizers make holds parts of two runs (letters, digits) of the check: the runs
    the comparison anchors on are never finer than the model's tokens. (SmolLM2 merges some marks, ``=-``: the
    check then sees a mark inserted where the model sees another mark, which only makes it stricter.)"""
    tok = _tokenizer(name)
    texts = [d for f in sorted(FAMILIES) for e in hidden_set(f, N)[:20] for d in [e.prompt, *glue_disguises(e.prompt)]]
    for text in texts:
        spans = [m.span() for m in re.finditer(r"[^\W\d_]+|\d+", text.replace("_", " "))]
        run_of = {}
        for n, (a, b) in enumerate(spans):
            run_of.update({i: n for i in range(a, b)})
        for a, b in tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]:
            assert len({run_of[i] for i in range(a, b) if i in run_of}) <= 1, (text, text[a:b])
    assert tokens("7CALC: 11-3-3=") == ("7", "calc", ":", "11", "-", "3", "-", "3", "=")
