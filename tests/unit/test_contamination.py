"""Contamination by disguise: hidden items written so that a plain token match misses them are still found.

Each disguise is applied to hidden prompts (must be flagged) and, as a control, to the family's own
training prompts (must not be): folding catches the disguise without flagging clean data.
"""

from __future__ import annotations

import json
import string

import pytest
import yaml

from agent_trainer.evaluation.contamination import find_overlap, fold, tokens
from agent_trainer.evaluation.families import FAMILIES, get_family
from agent_trainer.evaluation.hidden_eval import hidden_set
from agent_trainer.inner_loop.isolation.contamination import check_job, check_trained
from agent_trainer.inner_loop.train.data import TRAINED_ROWS, build_rows, trained_record
from agent_trainer.inner_loop.spec.jobspec import load_job

N = 200
CYRILLIC = str.maketrans("aceopxyABCEHKMOPTX", "асеорхуАВСЕНКМОРТХ")
GREEK = str.maketrans("oiABEHIKMNOPTXYZ", "οιΑΒΕΗΙΚΜΝΟΡΤΧΥΖ")
ARABIC_DIGITS = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")
FULLWIDTH = {ord(c): chr(ord(c) + 0xFEE0) for c in string.ascii_letters + string.digits + "=:-+"}
BOLD = {**{ord(c): chr(0x1D41A + i) for i, c in enumerate(string.ascii_lowercase)},
        **{ord(c): chr(0x1D7CE + i) for i, c in enumerate(string.digits)}}


def between(sep: str):
    return lambda text: sep.join(text)


DISGUISES = {
    "zero_width_space": between("\u200b"),
    "word_joiner": between("\u2060"),
    "byte_order_mark": between("\ufeff"),
    "soft_hyphen": between("\u00ad"),
    "bidi_marks": between("\u200e\u200f"),
    "tag_characters": lambda t: "".join(c + "\U000E0041" for c in t),
    "combining_grapheme_joiner": between("\u034f"),
    "variation_selectors": between("\ufe0f"),
    "combining_accents": lambda t: "".join(c + "\u0301" if c.isalpha() else c for c in t),
    "hangul_filler": between("\u3164"),
    "braille_blank": between("\u2800"),
    "cyrillic_lookalikes": lambda t: t.translate(CYRILLIC),
    "greek_lookalikes": lambda t: t.translate(GREEK),
    "arabic_indic_digits": lambda t: t.translate(ARABIC_DIGITS),
    "fullwidth": lambda t: t.translate(FULLWIDTH),
    "math_bold": lambda t: t.translate(BOLD),
    "no_break_spaces": lambda t: t.replace(" ", "\u00a0\u2003"),
    "upper_case_mixed_scripts": lambda t: t.upper().translate(CYRILLIC),
}
FAMILY_NAMES = sorted(FAMILIES)


@pytest.mark.parametrize("family", FAMILY_NAMES)
@pytest.mark.parametrize("name", sorted(DISGUISES))
def test_disguised_hidden_items_are_found_and_disguised_clean_items_are_not(family, name):
    disguise = DISGUISES[name]
    hidden = hidden_set(family, N)[:5]
    r = find_overlap(family, N, [(f"row {i}", disguise(e.prompt)) for i, e in enumerate(hidden)])
    assert r.hits == len({e.prompt for e in hidden}), f"{name} hid {family} items: {r.summary()}"
    clean = get_family(family).training_examples(seed=5, n=50)
    control = find_overlap(family, N, [(f"clean {i}", disguise(e.prompt)) for i, e in enumerate(clean)])
    assert not control.flagged, f"{name} made clean {family} rows look contaminated: {control.sources}"


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_folded_library_rows_never_look_contaminated(family):
    rows = get_family(family).training_examples(seed=0, n=2000)
    texts = [(str(i), e.prompt + e.answer) for i, e in enumerate(rows)]
    assert not find_overlap(family, N, texts).flagged


def test_folding_keeps_ascii_apart_but_for_case():
    groups: dict[str, set[str]] = {}
    for c in string.ascii_letters + string.digits + string.punctuation:
        groups.setdefault(fold(c), set()).add(c)
    assert all(v in ({k}, {k, k.upper()}) for k, v in groups.items()), groups
    assert fold("Тх οΟ ١") == "tx oo 1"
    assert tokens("CALC: 1\u200b1 - 3 - 3 =") == tokens("calc: 11-3-3=")


def _job(tmp_path, rows, algorithm="sft"):
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = {"base_model": "tiny-s", "algorithm": algorithm, "seed": 0,
            "hyperparameters": {"learning_rate": 1e-3, "batch_size": 8, "max_steps": 2},
            "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": 32}], "file": "data.jsonl"}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_job(tmp_path)


def test_hidden_items_split_across_fields_are_found(tmp_path):
    """The model reads prompt + answer as one text: a hidden prompt cut anywhere across fields is whole again."""
    h = hidden_set("calc_chain", N)
    rows = [
        {"prompt": h[0].prompt[:-1], "answer": h[0].prompt[-1] + h[0].answer},            # last character moved
        {"prompt": h[1].prompt[:6], "answer": h[1].prompt[6:] + h[1].answer},              # cut in the middle
        {"prompt": h[2].prompt[:4], "answer": h[2].prompt[4:9], "hint": h[2].prompt[9:]},  # three ways
        {"prompt": "calc: ", "answer": "\u200b".join(h[3].prompt[6:-1]), "tail": "="},     # three ways, disguised
    ]
    spec = _job(tmp_path / "job", rows)
    r = check_job(spec, tmp_path / "job", "calc_chain", N)
    assert r.flagged and r.hits == 4, r.summary()
    clean = get_family("calc_chain").training_examples(seed=5, n=20)
    spec = _job(tmp_path / "clean", [{"prompt": e.prompt[:-1], "answer": e.prompt[-1] + e.answer} for e in clean])
    assert not check_job(spec, tmp_path / "clean", "calc_chain", N).flagged


def _record(folder, rows):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / TRAINED_ROWS).write_text("".join(json.dumps(r) + "\n" for r in trained_record(rows)))


def test_trained_rows_must_be_the_declared_rows(tmp_path):
    """After training: the rows the job's process recorded are compared with the declared data."""
    clean = get_family("calc_chain").training_examples(seed=5, n=20)
    job = tmp_path / "job"
    spec = _job(job, [{"prompt": e.prompt, "answer": e.answer} for e in clean])
    declared = build_rows(spec, job, default_family="calc_chain")
    out = tmp_path / "out"
    _record(out, declared)
    assert not check_trained(spec, job, out, "calc_chain", N).flagged
    swapped = list(declared)
    swapped[3] = {"prompt": hidden_set("calc_chain", N)[0].prompt, "answer": "1"}  # a row the job never declared
    _record(out, swapped)
    r = check_trained(spec, job, out, "calc_chain", N)
    assert r.flagged and r.kinds["undeclared"] == 1 and "not the job's declared data" in r.summary()
    (out / TRAINED_ROWS).unlink()
    assert check_trained(spec, job, out, "calc_chain", N).flagged, "no record: the rows cannot be vouched for"


def test_sampled_trained_rows_are_checked_against_the_hidden_set(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.yaml").write_text(yaml.safe_dump({
        "base_model": "tiny-s", "algorithm": "sft", "seed": 0, "hyperparameters": {"max_steps": 2},
        "data": {"sources": [{"family": "calc_chain", "size": 16, "self_generated": {"samples_per_prompt": 2}}]},
        "reward": {"functions": [{"name": "exact_match"}]}}))
    spec = load_job(job)
    out = tmp_path / "out"
    _record(out, [{"prompt": "calc: 1+2=", "answer": "3"}])
    assert not check_trained(spec, job, out, "calc_chain", N).flagged
    h = hidden_set("calc_chain", N)[7]
    _record(out, [{"prompt": "calc: 1+2=", "answer": "3"}, {"prompt": h.prompt, "answer": h.answer}])
    r = check_trained(spec, job, out, "calc_chain", N)
    assert r.flagged and r.hits == 1
